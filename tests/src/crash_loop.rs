//! The crash loop: one `hopper run` process, killed with SIGKILL at random
//! moments and restarted each time, while a stream of messages with mixed
//! outcomes goes through it. Then every message's fate is counted from the
//! topics where messages end, without asking hopper:
//!
//! | message `c<i>`, by `i % 20` | sent to        | its fate                                                   |
//! |-----------------------------|----------------|------------------------------------------------------------|
//! | 0–11: ok                    | the route      | `c<i>/emit/0` on the done topic (the `acting` fixture emits it) |
//! | 12–13: fatal                | the route      | the DLQ, `FATAL`, attempt 1                                |
//! | 14–15: retryable            | the route      | the DLQ, `RETRIES_EXHAUSTED`, attempt 3, after tiers 1s, 2s |
//! | 16–19: delayed              | the delay inbox | the sink topic, not before its `hopper-deliver-at` (0.5–8 s ahead) |
//!
//! Kill k comes once about (k + 1) / (K + 1) of the stream is produced,
//! and the current process has been bringing messages to their fate for
//! 1.5 s (so it had the chance to commit once), plus a random 0–500 ms:
//! every kill lands while hopper is busy. (A
//! restarted process waits out the killed member's session timeout, 10 s,
//! before its group hands it partitions; the stream is produced slowly
//! enough, 500 messages/s by default, for the kills to fall inside it.) A duplicate is a fate that arrived more than once;
//! each is put down to the last kill before its second copy. Each kill's
//! duplicates are reported in two parts: those whose first copy was made in
//! the [`COMMIT_WINDOW_MS`] before the kill (done, not yet committed: the
//! time since the last commit), and older ones, which waited behind a lower
//! offset still in flight at the kill (the in-flight window: a call running,
//! a hop not yet acknowledged, a delayed message's last stretch in memory).

use crate::fleet::{HopperProcess, Ledger, Outgoing, Seen, acting_script};
use crate::{ConfigBuilder, DelayTable, RouteTable, create_topics_with, now_ms, plugin, rand_name};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The run's sizes. `cargo xtask crash-loop --messages N --kills K --rate R`.
#[derive(Clone, Debug)]
pub struct Params {
    pub messages: usize,
    pub kills: usize,
    /// Messages produced per second.
    pub rate: u32,
    /// How long the last process may take, after the stream, to bring every
    /// message to its fate.
    pub settle: Duration,
    /// Print progress to stderr.
    pub progress: bool,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            messages: 100_000,
            kills: 20,
            rate: 500,
            settle: Duration::from_secs(300),
            progress: true,
        }
    }
}

impl Params {
    /// Parses `--messages N --kills K --rate R --settle SECS`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Params, String> {
        let mut params = Params::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |what: &str| -> Result<u64, String> {
                value
                    .parse()
                    .map_err(|e| format!("{what} `{value}` is not a number: {e}"))
            };
            match flag.as_str() {
                "--messages" => params.messages = number("--messages")? as usize,
                "--kills" => params.kills = number("--kills")? as usize,
                "--rate" => params.rate = number("--rate")?.max(1) as u32,
                "--settle" => params.settle = Duration::from_secs(number("--settle")?),
                other => {
                    return Err(format!(
                        "unknown flag `{other}` (usage: --messages N --kills K --rate R --settle SECS)"
                    ));
                }
            }
        }
        if params.messages < 20 {
            return Err("--messages must be at least 20, one of each kind".into());
        }
        Ok(params)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Ok,
    Fatal,
    Retry,
    Delayed,
}

pub fn kind(i: usize) -> Kind {
    match i % 20 {
        0..=11 => Kind::Ok,
        12 | 13 => Kind::Fatal,
        14 | 15 => Kind::Retry,
        _ => Kind::Delayed,
    }
}

/// How long an offset can stay uncommitted after its hop was acknowledged,
/// when nothing before it is in flight: the pipeline's 50 ms store tick and
/// librdkafka's 100 ms auto-commit, plus the commit's round trip.
pub const COMMIT_WINDOW_MS: i64 = 200;

/// A bound on how long an offset can stay uncommitted after its hop was
/// acknowledged, in flight window included, with margin for a loaded
/// machine; the run waits this long for late duplicates.
pub const UNCOMMITTED_WINDOW_MS: i64 = 2_000;

/// How long a restarted process works (from its first fate) before it may
/// be killed: longer than librdkafka's 1 s auto-commit interval.
pub const BUSY_BEFORE_KILL: Duration = Duration::from_millis(1_500);

/// One kill: when, and what it led to.
#[derive(Clone, Debug, Default)]
pub struct KillReport {
    /// Epoch ms when the killed process was gone.
    pub at: i64,
    /// Distinct fates seen when it was killed.
    pub fates_before: usize,
    /// Every message was at its fate already: nothing was in flight.
    pub idle: bool,
    /// Fates whose first copy was produced within [`COMMIT_WINDOW_MS`]
    /// before the kill: done, and maybe not yet committed.
    pub window: usize,
    /// Extra copies put down to this kill.
    pub duplicates: usize,
    /// Of those, the ones whose first copy was made within
    /// [`COMMIT_WINDOW_MS`] before the kill: lost to the time since the last
    /// commit.
    pub since_commit: usize,
    /// And the older ones: held uncommitted behind a lower offset in flight
    /// at the kill.
    pub behind_in_flight: usize,
    /// The oldest first copy of a duplicate, ms before the kill (negative:
    /// after it, as when a retry hop was duplicated and both copies then
    /// went down the ladder).
    pub oldest_ms: i64,
    /// First hops off the input topic (the `ok` emit, the `fatal`
    /// dead letter, the `retryable` first retry) made again after the kill:
    /// the ones whose lag is judged.
    pub judged: usize,
    /// How long, at most, a judged duplicate's whole partition prefix had
    /// been done before the kill without being committed: 0 when each was
    /// behind an offset still in flight. [`commit_lags`].
    pub commit_lag_ms: i64,
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Summary {
    pub messages: usize,
    pub by_kind: BTreeMap<String, usize>,
    pub lost: Vec<String>,
    /// Records on the done, DLQ or sink topics that no message should
    /// produce (an unknown id, a wrong reason, attempt or trail).
    pub unexpected: Vec<String>,
    /// Delayed messages delivered before their deliver-at, by the record's
    /// timestamp or by when it was read: (id, ms early).
    pub early: Vec<(String, i64)>,
    pub lateness_p50_ms: i64,
    pub lateness_p99_ms: i64,
    pub lateness_max_ms: i64,
    /// Duplicated messages and their extra copies, by kind.
    pub duplicates: BTreeMap<String, (usize, usize)>,
    /// Extra copies that came before the first kill.
    pub duplicates_without_kill: usize,
    pub kills: Vec<KillReport>,
    pub elapsed: Duration,
}

impl Summary {
    /// Whether the run kept every promise: nothing lost, nothing early,
    /// nothing unexpected.
    pub fn passed(&self) -> bool {
        self.lost.is_empty() && self.early.is_empty() && self.unexpected.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "crash loop: {} messages {:?}, {} kills, {:.0?}",
            self.messages,
            self.by_kind,
            self.kills.len(),
            self.elapsed
        )?;
        writeln!(f, "  lost: {}", self.lost.len())?;
        writeln!(
            f,
            "  delayed delivered early: {}; lateness p50 {} ms, p99 {} ms, max {} ms (by the target record's timestamp, kills included)",
            self.early.len(),
            self.lateness_p50_ms,
            self.lateness_p99_ms,
            self.lateness_max_ms
        )?;
        writeln!(f, "  unexpected records: {}", self.unexpected.len())?;
        let (messages, copies) = self
            .duplicates
            .values()
            .fold((0, 0), |(m, c), (dm, dc)| (m + dm, c + dc));
        writeln!(
            f,
            "  duplicates: {messages} messages, {copies} extra copies ({} before the first kill)",
            self.duplicates_without_kill
        )?;
        for (kind, (m, c)) in &self.duplicates {
            writeln!(f, "    {kind}: {m} messages, {c} extra copies")?;
        }
        writeln!(
            f,
            "  commit lag at the kills: {} ms at most, over {} first hops off the input topic made again (the promise: the in-flight window + {COMMIT_WINDOW_MS} ms)",
            self.kills
                .iter()
                .map(|k| k.commit_lag_ms)
                .max()
                .unwrap_or(0),
            self.kills.iter().map(|k| k.judged).sum::<usize>()
        )?;
        writeln!(
            f,
            "  per kill: fates done by then, fates in the {COMMIT_WINDOW_MS} ms before it; extra copies after it = first copies made in those {COMMIT_WINDOW_MS} ms (since the last commit) + older ones (behind an offset in flight); oldest first copy (ms before the kill); first hops off the input topic made again, and the commit lag they show (how long the longest done prefix had waited uncommitted; 0: each was behind an offset in flight)"
        )?;
        for (n, k) in self.kills.iter().enumerate() {
            writeln!(
                f,
                "    kill {:>2}: {:>7} done, {:>5} in the last {COMMIT_WINDOW_MS} ms; duplicates {:>5} = {:>5} since the last commit + {:>5} behind in flight; oldest {:>6} ms; first hops again {:>5}, commit lag {:>5} ms{}",
                n + 1,
                k.fates_before,
                k.window,
                k.duplicates,
                k.since_commit,
                k.behind_in_flight,
                k.oldest_ms,
                k.judged,
                k.commit_lag_ms,
                if k.idle {
                    " (idle: every message done)"
                } else {
                    ""
                }
            )?;
        }
        for (what, list) in [("lost", &self.lost), ("unexpected", &self.unexpected)] {
            if !list.is_empty() {
                writeln!(f, "  first {what}: {:?}", &list[..list.len().min(10)])?;
            }
        }
        if !self.early.is_empty() {
            writeln!(
                f,
                "  first early: {:?}",
                &self.early[..self.early.len().min(10)]
            )?;
        }
        write!(
            f,
            "  result: {}",
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

struct Topics {
    input: String,
    /// The route's first retry tier, where a `retryable` message's first
    /// hop off the input topic lands.
    tier1: String,
    done: String,
    dlq: String,
    inbox: String,
    sink: String,
}

/// Runs the crash loop against the test broker ([`brokers`]); an error is a
/// run that could not go on (hopper would not start, or the messages never
/// all arrived), with the last process's log.
pub async fn run(params: &Params) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let name = rand_name("crash");
    let t = Topics {
        input: format!("{name}.in"),
        tier1: format!("{name}.retry.1s"),
        done: format!("{name}.done"),
        dlq: format!("{name}.dlq"),
        inbox: format!("{name}.delay"),
        sink: format!("{name}.later"),
    };
    create_topics_with(&[&t.input, &t.tier1, &t.done, &t.dlq, &t.inbox, &t.sink], 6).await;
    let file = ConfigBuilder::new()
        .partitions(6)
        .route(
            RouteTable::named(&name, &plugin("acting"))
                .topics(&[&t.input])
                .emit_topics(&[&t.done])
                .retry(&["1s", "2s"])
                .max_attempts(3),
        )
        .delay(DelayTable::named(&t.inbox).tiers(&["1s", "5s"]))
        .write();
    let (dir, config) = (&file.dir, &file.path);
    // The input topic and the first tier too: where each message was, and
    // when its first hop was done (for the commit lag).
    let ledger = Ledger::start(&[
        t.done.clone(),
        t.dlq.clone(),
        t.sink.clone(),
        t.input.clone(),
        t.tier1.clone(),
    ]);
    let say = |line: String| {
        if params.progress {
            eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
        }
    };
    let fates_now = || ledger.with(|r| fates(r, &t).len());

    let mut generation = 1;
    let mut process = HopperProcess::spawn("hopper-1", config, dir.path());
    say(format!(
        "started hopper (pid {}), producing {} messages at {}/s",
        process.pid(),
        params.messages,
        params.rate
    ));
    let produced = Arc::new(AtomicUsize::new(0));
    let producing = tokio::spawn({
        let produced = produced.clone();
        let (input, done, inbox, sink) = (
            t.input.clone(),
            t.done.clone(),
            t.inbox.clone(),
            t.sink.clone(),
        );
        let messages = params.messages;
        let rate = params.rate;
        async move {
            let mut rng = StdRng::from_rng(&mut rand::rng());
            crate::fleet::produce_paced(messages, rate, move |i| {
                produced.store(i + 1, Ordering::Relaxed);
                let id = format!("c{i}");
                let script = |verdict| acting_script(&id, verdict, &done);
                let (topic, payload, mut headers) = match kind(i) {
                    Kind::Ok => (input.clone(), script("ok"), vec![]),
                    Kind::Fatal => (input.clone(), script("fatal"), vec![]),
                    Kind::Retry => (input.clone(), script("retry"), vec![]),
                    Kind::Delayed => {
                        let at = now_ms() + rng.random_range(500..8_000);
                        (
                            inbox.clone(),
                            format!("deliver-at:{at}"),
                            vec![
                                ("hopper-target", sink.clone()),
                                ("hopper-deliver-at", at.to_string()),
                            ],
                        )
                    }
                };
                headers.push(("hopper-id", id.clone()));
                Outgoing {
                    topic,
                    key: id,
                    payload,
                    headers,
                }
            })
            .await
        }
    });

    let mut kills = Vec::new();
    let mut rng = StdRng::from_rng(&mut rand::rng());
    let stride = params.messages / (params.kills + 1);
    for k in 0..params.kills {
        // Kill k comes once about (k + 1) / (kills + 1) of the stream is
        // produced (give or take half a stride), and once the process has
        // been bringing messages to their fate for BUSY_BEFORE_KILL: it is
        // past its start and its group's rebalance, and busy. When every message is
        // done early, the kills left come anyway (`idle`).
        let target = stride * (k + 1) - rng.random_range(0..=stride / 2);
        let spawned = Instant::now();
        let spawned_ms = now_ms();
        // Fates this process produced: records stamped since it started.
        // (The ledger reads with a lag, so a fate the killed process
        // produced can arrive after the restart.)
        let own_fates = || {
            ledger.with(|r| {
                r.iter()
                    .filter(|s| s.timestamp >= spawned_ms && fate(s, &t).is_some())
                    .count()
            })
        };
        let mut last_say = Instant::now();
        let mut working: Option<Instant> = None;
        let idle = loop {
            let now = fates_now();
            if working.is_none() && own_fates() > 0 {
                working = Some(Instant::now());
            }
            // Busy long enough for one auto-commit (1 s) to have happened:
            // a process killed before its first commit re-handles all its
            // predecessor re-handled, and the duplicates compound.
            if produced.load(Ordering::Relaxed) >= target
                && working.is_some_and(|t| t.elapsed() >= BUSY_BEFORE_KILL)
            {
                break false;
            }
            if now >= params.messages && spawned.elapsed() > Duration::from_secs(1) {
                break true;
            }
            if let Some(status) = process.exited() {
                anyhow::bail!(
                    "{} exited on its own ({status}):\n{}",
                    process.label,
                    process.log_tail(40)
                );
            }
            if last_say.elapsed() > Duration::from_secs(5) {
                say(format!(
                    "{now} of {} messages at their fate, {} produced; kill {} at {target} produced",
                    params.messages,
                    produced.load(Ordering::Relaxed),
                    k + 1
                ));
                last_say = Instant::now();
            }
            if spawned.elapsed() > params.settle {
                anyhow::bail!(
                    "{} made no progress in {:?}: {now} fates\n{}",
                    process.label,
                    params.settle,
                    process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        process.kill9();
        let at = now_ms();
        let fates_before = fates_now();
        say(format!(
            "kill {} of {} (pid {}) with {fates_before} messages at their fate",
            k + 1,
            params.kills,
            process.pid()
        ));
        kills.push(KillReport {
            at,
            fates_before,
            idle,
            ..Default::default()
        });
        generation += 1;
        process = HopperProcess::spawn(&format!("hopper-{generation}"), config, dir.path());
    }
    producing.await?;
    say("all messages produced; waiting for every fate".into());
    let deadline = Instant::now() + params.settle;
    let mut last_say = Instant::now();
    loop {
        let now = fates_now();
        if now >= params.messages {
            break;
        }
        if let Some(status) = process.exited() {
            anyhow::bail!(
                "{} exited on its own ({status}):\n{}",
                process.label,
                process.log_tail(40)
            );
        }
        if Instant::now() > deadline {
            say(format!(
                "only {now} of {} messages at their fate after {:?}",
                params.messages, params.settle
            ));
            break;
        }
        if last_say.elapsed() > Duration::from_secs(5) {
            say(format!(
                "{now} of {} messages at their fate",
                params.messages
            ));
            last_say = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Late duplicates from the last restart arrive within the window.
    tokio::time::sleep(Duration::from_millis(UNCOMMITTED_WINDOW_MS as u64)).await;
    match process.stop(Duration::from_secs(45)).await {
        Ok(status) if status.success() => {}
        Ok(status) => say(format!("the last hopper exited with {status}")),
        Err(e) => say(e),
    }
    if let Some(e) = ledger.last_error() {
        say(format!("the reader saw an error (and read on): {e}"));
    }
    let records = ledger.with(|r| r.to_vec());
    let mut summary = summarise(params, &records, &t, kills);
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// The fate of every message that has one, by id: which kind of end it
/// reached.
fn fates(records: &[Seen], t: &Topics) -> HashMap<String, Kind> {
    let mut out = HashMap::new();
    for r in records {
        if let Some(kind) = fate(r, t) {
            out.insert(fate_id(r).to_string(), kind);
        }
    }
    out
}

fn fate_id(r: &Seen) -> &str {
    r.id.strip_suffix("/emit/0").unwrap_or(&r.id)
}

/// The end `r` stands for, if it is one (not checked against the id).
fn fate(r: &Seen, t: &Topics) -> Option<Kind> {
    if r.topic == t.done {
        r.id.ends_with("/emit/0").then_some(Kind::Ok)
    } else if r.topic == t.sink {
        Some(Kind::Delayed)
    } else if r.topic == t.dlq {
        match r.reason.as_deref() {
            Some("FATAL") => Some(Kind::Fatal),
            Some("RETRIES_EXHAUSTED") => Some(Kind::Retry),
            _ => None,
        }
    } else {
        None
    }
}

/// Every message's place on the input topic, `(partition, offset)`, with
/// the timestamps of every copy of its first hop off it: the `ok` emit, the
/// `fatal` dead letter, the `retryable` record on the first tier. The
/// offset is done once that hop is acknowledged, a few ms after the copy's
/// timestamp.
fn first_hops(records: &[Seen], t: &Topics) -> BTreeMap<(i32, i64), Vec<i64>> {
    let mut at: HashMap<&str, (i32, i64)> = HashMap::new();
    let mut hops = BTreeMap::new();
    for r in records.iter().filter(|r| r.topic == t.input) {
        at.insert(&r.id, (r.partition, r.offset));
        hops.insert((r.partition, r.offset), Vec::new());
    }
    for r in records {
        let first_hop = (r.topic == t.done && r.id.ends_with("/emit/0"))
            || (r.topic == t.dlq && r.reason.as_deref() == Some("FATAL") && r.attempt == Some(1))
            || r.topic == t.tier1;
        if let Some(place) = first_hop.then(|| at.get(fate_id(r))).flatten() {
            hops.entry(*place)
                .or_insert_with(Vec::new)
                .push(r.timestamp);
        }
    }
    hops
}

/// For each kill (epoch ms, in order): how many first hops were made again
/// after it, and the longest any of them had been done, with every offset
/// before it on its partition, without being committed.
///
/// The killed process's work is what it did between the kill before and
/// this one. On each partition it started at the offset it was handed (its
/// lowest copy; everything below was done before: a process is killed only
/// after 1.5 s of work, so an offset it was handed and left in flight all
/// that time would be a stall the run reports anyway) and went up. A message
/// made again after the kill was either behind an offset the process had
/// not done (in flight: lag 0), or its whole prefix was done at the latest
/// of their copies, `D`, and not committed by the kill: lag `kill - D`. The
/// promise is a lag within the commit window (in-flight window + 200 ms).
pub fn commit_lags(hops: &BTreeMap<(i32, i64), Vec<i64>>, kills: &[i64]) -> Vec<(usize, i64)> {
    let mut partitions: BTreeMap<i32, Vec<&Vec<i64>>> = BTreeMap::new();
    for (&(p, _), copies) in hops {
        partitions.entry(p).or_default().push(copies);
    }
    let mut out = Vec::with_capacity(kills.len());
    for (k, &kill) in kills.iter().enumerate() {
        let before = if k == 0 { i64::MIN } else { kills[k - 1] };
        let after = kills.get(k + 1).copied().unwrap_or(i64::MAX);
        let own = |copies: &[i64]| {
            copies
                .iter()
                .filter(|&&c| c >= before && c < kill)
                .min()
                .copied()
        };
        let (mut judged, mut lag) = (0, 0);
        for offsets in partitions.values() {
            // Where the process started on this partition: its lowest copy.
            // Below it, an offset counts as done at its latest copy by an
            // earlier process. A partition it made no copy on at all, it
            // had not got going on: everything there was in flight.
            let start = offsets.iter().position(|c| own(c).is_some());
            // The latest done time of the prefix so far; `None` once an
            // offset was not done at the kill.
            let mut prefix = start.map(|_| i64::MIN);
            for (i, copies) in offsets.iter().enumerate() {
                let done = if start.is_some_and(|s| i >= s) {
                    own(copies)
                } else {
                    copies.iter().filter(|&&c| c < before).max().copied()
                };
                prefix = prefix.zip(done).map(|(latest, done)| latest.max(done));
                let again = copies.iter().any(|&c| c >= kill && c < after);
                if again && copies.iter().any(|&c| c < kill) {
                    judged += 1;
                    if let Some(latest) = prefix {
                        lag = lag.max(kill - latest);
                    }
                }
            }
        }
        out.push((judged, lag));
    }
    out
}

fn summarise(params: &Params, records: &[Seen], t: &Topics, mut kills: Vec<KillReport>) -> Summary {
    let mut s = Summary {
        messages: params.messages,
        ..Default::default()
    };
    for i in 0..params.messages {
        *s.by_kind.entry(format!("{:?}", kind(i))).or_default() += 1;
    }
    // First copy of each fate, and every later one.
    let mut first: HashMap<&str, &Seen> = HashMap::new();
    let mut extra: Vec<(&Seen, &Seen)> = Vec::new();
    let mut lateness = Vec::new();
    for r in records {
        if r.topic == t.input || r.topic == t.tier1 {
            continue;
        }
        let id = fate_id(r);
        let i = id
            .strip_prefix('c')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < params.messages);
        let expected = i.map(kind);
        let fits = match (expected, fate(r, t)) {
            (Some(Kind::Ok), Some(Kind::Ok)) => true,
            (Some(Kind::Fatal), Some(Kind::Fatal)) => {
                r.attempt == Some(1) && r.trail.as_deref() == Some("dlq")
            }
            (Some(Kind::Retry), Some(Kind::Retry)) => {
                r.attempt == Some(3) && r.trail.as_deref() == Some("retry.1s,retry.2s,dlq")
            }
            (Some(Kind::Delayed), Some(Kind::Delayed)) => true,
            _ => false,
        };
        if !fits {
            s.unexpected.push(format!(
                "{}[{}]@{} id={} reason={:?} attempt={:?} trail={:?}",
                r.topic, r.partition, r.offset, r.id, r.reason, r.attempt, r.trail
            ));
            continue;
        }
        if expected == Some(Kind::Delayed) {
            let due: i64 = r
                .payload
                .strip_prefix("deliver-at:")
                .and_then(|v| v.parse().ok())
                .unwrap_or(i64::MAX);
            let early = (due - r.timestamp).max(due - r.received);
            if early > 0 {
                s.early.push((id.to_string(), early));
            }
            lateness.push(r.timestamp - due);
        }
        if let Some(original) = first.get(id).copied() {
            extra.push((original, r));
        } else {
            first.insert(id, r);
        }
    }
    for i in 0..params.messages {
        let id = format!("c{i}");
        if !first.contains_key(id.as_str()) {
            s.lost.push(id);
        }
    }
    lateness.sort_unstable();
    let pick = |q: f64| {
        lateness
            .get(((lateness.len() as f64 * q) as usize).min(lateness.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    s.lateness_p50_ms = pick(0.50);
    s.lateness_p99_ms = pick(0.99);
    s.lateness_max_ms = lateness.last().copied().unwrap_or(0);

    for k in kills.iter_mut() {
        k.window = first
            .values()
            .filter(|r| r.timestamp > k.at - COMMIT_WINDOW_MS && r.timestamp <= k.at)
            .count();
        k.oldest_ms = i64::MIN;
    }
    let mut dup_ids: BTreeMap<Kind, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let mut dup_copies: BTreeMap<Kind, usize> = BTreeMap::new();
    for (original, copy) in &extra {
        let kind = fate(copy, t).expect("checked above");
        dup_ids.entry(kind).or_default().insert(fate_id(copy));
        *dup_copies.entry(kind).or_default() += 1;
        // The kill that led to it: the last before the copy was produced.
        match kills.iter_mut().rev().find(|k| k.at <= copy.timestamp) {
            Some(k) => {
                k.duplicates += 1;
                let age = k.at - original.timestamp;
                k.oldest_ms = k.oldest_ms.max(age);
                if age > COMMIT_WINDOW_MS {
                    k.behind_in_flight += 1;
                } else {
                    k.since_commit += 1;
                }
            }
            None => s.duplicates_without_kill += 1,
        }
    }
    for k in kills.iter_mut() {
        if k.oldest_ms == i64::MIN {
            k.oldest_ms = 0;
        }
    }
    let at: Vec<i64> = kills.iter().map(|k| k.at).collect();
    for (k, (judged, lag)) in kills
        .iter_mut()
        .zip(commit_lags(&first_hops(records, t), &at))
    {
        k.judged = judged;
        k.commit_lag_ms = lag;
    }
    for (kind, ids) in dup_ids {
        s.duplicates.insert(
            format!("{kind:?}"),
            (ids.len(), dup_copies.get(&kind).copied().unwrap_or(0)),
        );
    }
    s.kills = kills;
    s
}

#[cfg(test)]
mod tests {
    use super::commit_lags;
    use std::collections::BTreeMap;

    fn hops(list: &[((i32, i64), &[i64])]) -> BTreeMap<(i32, i64), Vec<i64>> {
        list.iter().map(|(at, c)| (*at, c.to_vec())).collect()
    }

    #[test]
    fn a_done_prefix_made_again_shows_how_long_it_waited() {
        // Kill at 1,000: offsets 0-2 done at 100, 700, 900, all made again
        // after it. Offset 0 had been done, uncommitted, for 900 ms.
        let h = hops(&[
            ((0, 0), &[100, 1_200]),
            ((0, 1), &[700, 1_200]),
            ((0, 2), &[900, 1_200]),
        ]);
        assert_eq!(commit_lags(&h, &[1_000]), vec![(3, 900)]);
    }

    #[test]
    fn a_message_behind_one_in_flight_has_no_lag() {
        // Offset 1 was not done at the kill: offset 2, done long before,
        // waited behind it.
        let h = hops(&[
            ((0, 0), &[100]),
            ((0, 1), &[1_500]),
            ((0, 2), &[200, 1_500]),
        ]);
        assert_eq!(commit_lags(&h, &[1_000]), vec![(1, 0)]);
    }

    #[test]
    fn each_kill_judges_its_own_process_from_where_it_started() {
        // Process 1 (to 1,000) did 0-2; after its kill, 1 and 2 are made
        // again (lags 100 and 50). Process 2 (1,000 to 3,000) was handed
        // offset 1 and did 1-2 again, then 3; after its kill, 3 is made
        // again: done at 2,000 with 1-2 (2,100 at the latest), so lag 900.
        // Offset 0, done by process 1 and never again, counts as done.
        let h = hops(&[
            ((0, 0), &[100]),
            ((0, 1), &[900, 2_100]),
            ((0, 2), &[950, 1_500]),
            ((0, 3), &[2_000, 3_500]),
            // Another partition, where process 2 made no copy: in flight.
            ((1, 0), &[400, 3_600]),
        ]);
        assert_eq!(commit_lags(&h, &[1_000, 3_000]), vec![(2, 100), (2, 900)]);
    }
}
