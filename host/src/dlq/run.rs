//! Replay runs: what makes a replay resumable and never twice.
//!
//! Each replay is a run with an id. Every record a run replays gets a
//! journal entry in `<dlq>.replays` that names the run, written and
//! acknowledged *before* the replay is produced; the replayed record names
//! the run too ([`RUN`]). A run resumed with the same id skips every record
//! its entries name.
//!
//! An entry can outlive its replay: a kill -9, a crash or a failed produce
//! between the two. Each process of a run is one attempt, and an attempt
//! replays in batches (at most [`super::replay::MAX_BATCH`] records): it
//! writes all of a batch's entries and awaits their acknowledgements, then
//! produces the batch's replays and awaits them, and only then writes the
//! next batch's entries. Each entry counts its place in the attempt
//! ([`ATTEMPT`]) and names its batch by the place of the batch's first entry
//! ([`BATCH`]), so only the entries of an attempt's last batch can be ones
//! whose replay was not produced; those of its earlier batches are done. A
//! resume reads the destination of the records of each last batch from the
//! end offsets their entries wrote down ([`AFTER`]), read before the batch
//! was produced, and replays a record only when no record of the run
//! replayed from it is there.
//!
//! A journal entry of the run that does not read back (a key that is not a
//! record, a missing or malformed [`ATTEMPT`], [`BATCH`], [`AFTER`] or
//! [`ENTRY`]) stops the resume with an error naming it: left out, its record
//! could be replayed twice.

use super::browse::{DlqError, MAX_SCAN, read_all, read_from};
use super::record::RecordRef;
use crate::config::replay_journal;
use crate::headers;
use crate::kafka::Cluster;
use rdkafka::message::{Headers, Message, OwnedMessage};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// Names the run, on each journal entry and each replayed record.
pub const RUN: &str = "hopper-replay-run";
/// On a journal entry: `<attempt>/<n>`, the attempt (one process of the
/// run) and the entry's place in it.
pub const ATTEMPT: &str = "hopper-replay-attempt";
/// On a journal entry: the place in the attempt of its batch's first entry.
/// An entry without it (written one record at a time) is a batch of its
/// own.
pub const BATCH: &str = "hopper-replay-batch";
/// On a journal entry: the destination's end offsets, `partition:offset`
/// separated by commas, read before the replay was produced; at most
/// [`MAX_PARTITIONS`] of them.
pub const AFTER: &str = "hopper-replay-after";
/// On a journal entry: `replay`, `redo` (the replay of a record whose first
/// entry's replay was never produced: not counted again) or `loop` (a
/// REPLAY_LOOP copy: not a replay).
pub const ENTRY: &str = "hopper-replay-entry";
/// On a journal entry: where the record was replayed to.
pub const REPLAYED_TO: &str = "hopper-replayed-to";

/// Longest run id.
const MAX_RUN_ID: usize = 64;

/// The most partitions an [`AFTER`] header may name. Kafka sets no hard
/// limit, but a cluster holds far fewer partitions than this in all (tens
/// of thousands per broker at most), so a longer list is not one a replay
/// wrote.
pub const MAX_PARTITIONS: usize = 100_000;

/// A replay run's id: letters, digits, `-`, `_` and `.`, at most 64.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId(String);

impl RunId {
    /// A new id, random.
    pub fn new() -> RunId {
        RunId(format!("r{:016x}", fastrand::u64(..)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        RunId::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RunId {
    type Err = String;

    fn from_str(s: &str) -> Result<RunId, String> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if s.is_empty() || s.len() > MAX_RUN_ID || !s.chars().all(allowed) {
            return Err(format!(
                "`{}` is not a replay run id: 1 to {MAX_RUN_ID} letters, digits, `-`, `_` or `.`, as a replay prints it",
                headers::shorten(&s.escape_debug().to_string(), 80)
            ));
        }
        Ok(RunId(s.to_string()))
    }
}

/// A record whose entry was the last of an attempt: replayed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsure {
    pub at: RecordRef,
    /// Where it was being replayed to.
    pub to: String,
    /// Where to start reading `to` for it, per partition.
    pub after: HashMap<i32, i64>,
}

/// What a run did before, by its journal entries.
#[derive(Debug, Default)]
pub struct RunState {
    /// Entries of the run read.
    pub entries: usize,
    /// Records the run replayed (or copied with REPLAY_LOOP), for sure.
    pub done: HashSet<RecordRef>,
    /// Records whose replay may not have been produced.
    pub unsure: Vec<Unsure>,
}

/// Why a run's journal could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Dlq(#[from] DlqError),
    #[error(
        "journal entry {journal}:{partition}:{offset} names replay run {run}, but {problem}: cannot tell what the run replayed, so it is not resumed"
    )]
    Malformed {
        journal: String,
        partition: i32,
        offset: i64,
        run: String,
        problem: String,
    },
}

/// One journal entry of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    at: RecordRef,
    attempt: String,
    /// Its batch: the place of the batch's first entry in the attempt.
    batch: u64,
    kind: Kind,
    to: String,
    after: Vec<(i32, i64)>,
}

/// What a journal entry records ([`ENTRY`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Replay,
    Redo,
    Loop,
}

/// Reads a run's entries, one after the other, into a [`RunState`].
#[derive(Default)]
struct Tally {
    state: RunState,
    /// Entries per record.
    count: HashMap<RecordRef, u32>,
    /// Each attempt's last batch read so far, with its entries.
    last: HashMap<String, (u64, Vec<Entry>)>,
}

impl Tally {
    fn add(&mut self, entry: Entry) {
        self.state.entries += 1;
        *self.count.entry(entry.at.clone()).or_insert(0) += 1;
        match self.last.get_mut(&entry.attempt) {
            Some((batch, _)) if *batch > entry.batch => {}
            Some((batch, entries)) if *batch == entry.batch => entries.push(entry),
            _ => {
                self.last
                    .insert(entry.attempt.clone(), (entry.batch, vec![entry]));
            }
        }
    }

    /// A record is unsure when each of its entries is in the last batch
    /// of its attempt; a REPLAY_LOOP copy is never produced again (the
    /// record is in its dead-letter topic either way).
    fn finish(mut self) -> RunState {
        let mut lasts: HashMap<RecordRef, Vec<Entry>> = HashMap::new();
        for (_, entries) in self.last.into_values() {
            for entry in entries {
                lasts.entry(entry.at.clone()).or_default().push(entry);
            }
        }
        for (at, entries) in lasts {
            let all_last = self.count.get(&at).copied().unwrap_or(0) as usize == entries.len();
            if !all_last || entries.iter().any(|e| e.kind == Kind::Loop) {
                continue;
            }
            self.count.remove(&at);
            let mut after: HashMap<i32, i64> = HashMap::new();
            for (p, o) in entries.iter().flat_map(|e| e.after.iter().copied()) {
                let o = after.get(&p).map_or(o, |was| o.min(*was));
                after.insert(p, o);
            }
            self.state.unsure.push(Unsure {
                at,
                to: entries[0].to.clone(),
                after,
            });
        }
        self.state.done = self.count.into_keys().collect();
        self.state
    }
}

impl RunState {
    /// Reads the run's entries in the journals of dead-letter topics
    /// `dlqs`. An entry of the run that does not read back is an error.
    pub fn load(cluster: &Cluster, dlqs: &[String], run: &RunId) -> Result<RunState, RunError> {
        let mut tally = Tally::default();
        for dlq in dlqs {
            let journal = replay_journal(dlq);
            let mut bad = None;
            let read = read_all(cluster, &journal, usize::MAX, |m| match entry_of(&m, run) {
                Ok(Some(entry)) => tally.add(entry),
                Ok(None) => {}
                Err(problem) => {
                    bad.get_or_insert(RunError::Malformed {
                        journal: journal.clone(),
                        partition: m.partition(),
                        offset: m.offset(),
                        run: run.to_string(),
                        problem,
                    });
                }
            });
            match read {
                Ok(_) | Err(DlqError::Lag(crate::lag::LagError::Missing { .. })) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(bad) = bad {
                return Err(bad);
            }
        }
        Ok(tally.finish())
    }
}

/// The entry `m` of the journal, if it is one of `run`'s; why not, if it
/// names `run` but does not read back.
fn entry_of(m: &OwnedMessage, run: &RunId) -> Result<Option<Entry>, String> {
    if headers::text(m.headers(), RUN).ok().flatten() != Some(run.as_str()) {
        return Ok(None);
    }
    let text = |key| header(m, key);
    let need = |key| header(m, key)?.ok_or_else(|| format!("header {key} is missing"));
    let at = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.parse::<RecordRef>().ok())
        .ok_or("its key is not a dead-letter record TOPIC:PARTITION:OFFSET")?;
    let attempt = need(ATTEMPT)?;
    let bad_attempt = || {
        format!(
            "header {ATTEMPT} is `{}`, not ATTEMPT/N",
            headers::shorten(&attempt.escape_debug().to_string(), 80)
        )
    };
    let (attempt, n) = attempt.rsplit_once('/').ok_or_else(bad_attempt)?;
    let n: u64 = n.parse().map_err(|_| bad_attempt())?;
    let batch = match text(BATCH)? {
        None => n,
        Some(b) => match b.parse::<u64>() {
            Ok(b) if b <= n => b,
            _ => {
                return Err(format!(
                    "header {BATCH} is `{}`, not the place of an entry at or before this one ({n})",
                    headers::shorten(&b.escape_debug().to_string(), 80)
                ));
            }
        },
    };
    let kind = match text(ENTRY)? {
        None | Some("replay") => Kind::Replay,
        Some("redo") => Kind::Redo,
        Some("loop") => Kind::Loop,
        Some(other) => {
            return Err(format!(
                "header {ENTRY} is `{}`, not replay, redo or loop",
                headers::shorten(&other.escape_debug().to_string(), 80)
            ));
        }
    };
    let after = parse_after(text(AFTER)?.unwrap_or_default())
        .map_err(|problem| format!("header {AFTER}: {problem}"))?;
    Ok(Some(Entry {
        at,
        attempt: attempt.to_string(),
        batch,
        kind,
        to: need(REPLAYED_TO)?.to_string(),
        after,
    }))
}

/// Header `key` of `m`, as text.
fn header<'m>(m: &'m OwnedMessage, key: &'static str) -> Result<Option<&'m str>, String> {
    headers::text(m.headers(), key).map_err(|e| format!("header {key}: {e}"))
}

/// `partition:offset,...` as [`AFTER`] holds it.
pub fn after_text(ends: &[(i32, i64)]) -> String {
    ends.iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`AFTER`]: empty, or at most [`MAX_PARTITIONS`] distinct
/// `partition:offset` pairs, neither negative.
fn parse_after(text: &str) -> Result<Vec<(i32, i64)>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    if text.split(',').nth(MAX_PARTITIONS).is_some() {
        return Err(format!(
            "more than {MAX_PARTITIONS} partitions, more than a topic can have"
        ));
    }
    let mut seen = HashSet::new();
    text.split(',')
        .map(|po| {
            let pair = po
                .split_once(':')
                .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)))
                .filter(|(p, o)| *p >= 0 && *o >= 0 && seen.insert(*p));
            pair.ok_or_else(|| {
                format!(
                    "`{}` is not PARTITION:OFFSET (each partition once, neither negative)",
                    headers::shorten(&po.escape_debug().to_string(), 40)
                )
            })
        })
        .collect()
}

/// What reading the destinations told of the unsure records.
#[derive(Debug, Default)]
pub struct Checked {
    /// Replayed: their replay is in the destination.
    pub replayed: HashSet<RecordRef>,
    /// Not replayed: to replay again.
    pub missing: HashSet<RecordRef>,
    /// Not known: more than [`MAX_SCAN`] records to read in the
    /// destination. Left out, so as never to replay twice.
    pub unknown: Vec<Unsure>,
}

/// Looks for the replay of each of `unsure` in its destination: a record
/// of `run` replayed from it, after the offsets its entry wrote down.
pub fn check(cluster: &Cluster, run: &RunId, unsure: Vec<Unsure>) -> Result<Checked, DlqError> {
    let mut checked = Checked::default();
    let mut by_topic: HashMap<String, Vec<Unsure>> = HashMap::new();
    for u in unsure {
        by_topic.entry(u.to.clone()).or_default().push(u);
    }
    for (topic, records) in by_topic {
        let mut from: HashMap<i32, i64> = HashMap::new();
        let mut after_all = true;
        for u in &records {
            after_all &= !u.after.is_empty();
            for (p, o) in &u.after {
                let o = from.get(p).map_or(*o, |was| (*o).min(*was));
                from.insert(*p, o);
            }
        }
        if !after_all {
            // An entry without offsets: read the whole topic.
            from.clear();
        }
        let wanted: HashSet<String> = records.iter().map(|u| u.at.to_string()).collect();
        let mut found = HashSet::new();
        let (_, truncated) = read_from(cluster, &topic, &from, MAX_SCAN, |m| {
            let header = |key| headers::text(m.headers(), key).ok().flatten();
            if header(RUN) == Some(run.as_str())
                && let Some(from) = header(headers::REPLAYED_FROM)
                && wanted.contains(from)
            {
                found.insert(from.to_string());
            }
        })?;
        for u in records {
            if found.contains(&u.at.to_string()) {
                checked.replayed.insert(u.at);
            } else if truncated {
                checked.unknown.push(u);
            } else {
                checked.missing.insert(u.at);
            }
        }
    }
    Ok(checked)
}

/// Whether journal entry `m` counts as a replay of its record: a redo or
/// a REPLAY_LOOP copy does not.
pub fn counts_as_replay(m: &OwnedMessage) -> bool {
    let Some(h) = m.headers() else { return true };
    !h.iter()
        .any(|h| h.key == ENTRY && matches!(h.value, Some(b"redo") | Some(b"loop")))
}

/// The run that wrote journal entry `m`, if any.
pub fn run_of(m: &OwnedMessage) -> Option<&str> {
    headers::text(m.headers(), RUN).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_is_short_and_plain() {
        assert!("r0123456789abcdef".parse::<RunId>().is_ok());
        let id = RunId::new();
        assert_eq!(id.as_str().parse::<RunId>(), Ok(id.clone()));
        for bad in ["", "a b", "x;rm -rf", "\u{1b}[31m", &"x".repeat(65)] {
            let e = bad.parse::<RunId>().unwrap_err();
            assert!(e.contains("is not a replay run id"), "{e}");
        }
    }

    #[test]
    fn offsets_after_read_back() {
        let text = after_text(&[(0, 12), (3, 7)]);
        assert_eq!(text, "0:12,3:7");
        assert_eq!(parse_after(&text), Ok(vec![(0, 12), (3, 7)]));
        assert_eq!(parse_after(""), Ok(vec![]));
        for bad in ["x:1,4:5", "2:y", "4:5,", "-1:3", "1:-3", "1:2,1:3", "1"] {
            let e = parse_after(bad).unwrap_err();
            assert!(e.contains("is not PARTITION:OFFSET"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_offset_list_longer_than_a_topic_can_be_is_refused() {
        let most: Vec<(i32, i64)> = (0..MAX_PARTITIONS as i32).map(|p| (p, 1)).collect();
        assert_eq!(
            parse_after(&after_text(&most)).unwrap().len(),
            MAX_PARTITIONS
        );
        let text = format!("{},{MAX_PARTITIONS}:1", after_text(&most));
        let e = parse_after(&text).unwrap_err();
        assert!(e.contains("more than 100000 partitions"), "{e}");
        // Refused before it is parsed: commas alone.
        let e = parse_after(&",".repeat(MAX_PARTITIONS + 5)).unwrap_err();
        assert!(e.contains("more than 100000 partitions"), "{e}");
    }

    /// A journal entry of run `r1`, at journal offset `offset`.
    fn entry(offset: i64, at: &str, headers: &[(&str, &str)]) -> OwnedMessage {
        let mut h = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: RUN,
            value: Some("r1"),
        });
        for (key, value) in headers {
            h = h.insert(rdkafka::message::Header {
                key,
                value: Some(*value),
            });
        }
        OwnedMessage::new(
            None,
            Some(at.as_bytes().to_vec()),
            "dlq.replays".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            offset,
            Some(h),
        )
    }

    fn batch_entry(at: &str, attempt: &str, batch: &str, after: &str) -> OwnedMessage {
        entry(
            0,
            at,
            &[
                (ATTEMPT, attempt),
                (BATCH, batch),
                (ENTRY, "replay"),
                (REPLAYED_TO, "in"),
                (AFTER, after),
            ],
        )
    }

    fn tally(entries: &[OwnedMessage]) -> RunState {
        let run: RunId = "r1".parse().unwrap();
        let mut tally = Tally::default();
        for m in entries {
            tally.add(entry_of(m, &run).unwrap().unwrap());
        }
        tally.finish()
    }

    fn refs(records: &[&str]) -> HashSet<RecordRef> {
        records.iter().map(|r| r.parse().unwrap()).collect()
    }

    #[test]
    fn every_entry_of_an_attempts_last_batch_is_unsure() {
        let state = tally(&[
            batch_entry("dlq:0:0", "a/0", "0", "0:5"),
            batch_entry("dlq:0:1", "a/1", "0", "0:5"),
            // The last batch of attempt a, written in any order.
            batch_entry("dlq:0:3", "a/3", "2", "0:9,1:4"),
            batch_entry("dlq:0:2", "a/2", "2", "0:7,1:4"),
            batch_entry("dlq:0:4", "a/4", "2", "0:7,1:6"),
            // Attempt b: one batch, its last.
            batch_entry("dlq:0:9", "b/0", "0", "0:20"),
            // A record of a's last batch that an earlier attempt replayed
            // too is done.
            batch_entry("dlq:0:1", "c/0", "0", "0:30"),
        ]);
        assert_eq!(state.entries, 7);
        assert_eq!(state.done, refs(&["dlq:0:0", "dlq:0:1"]));
        let mut unsure: Vec<(String, Vec<(i32, i64)>)> = state
            .unsure
            .iter()
            .map(|u| {
                let mut after: Vec<_> = u.after.iter().map(|(p, o)| (*p, *o)).collect();
                after.sort();
                (u.at.to_string(), after)
            })
            .collect();
        unsure.sort();
        assert_eq!(
            unsure,
            [
                ("dlq:0:2".to_string(), vec![(0, 7), (1, 4)]),
                ("dlq:0:3".to_string(), vec![(0, 9), (1, 4)]),
                ("dlq:0:4".to_string(), vec![(0, 7), (1, 6)]),
                ("dlq:0:9".to_string(), vec![(0, 20)]),
            ]
        );
        assert!(state.unsure.iter().all(|u| u.to == "in"));
    }

    #[test]
    fn an_entry_without_a_batch_is_a_batch_of_its_own() {
        let old = |at: &str, attempt: &str| {
            entry(
                0,
                at,
                &[(ATTEMPT, attempt), (REPLAYED_TO, "in"), (AFTER, "0:1")],
            )
        };
        let state = tally(&[old("dlq:0:0", "a/0"), old("dlq:0:1", "a/1")]);
        assert_eq!(state.done, refs(&["dlq:0:0"]));
        assert_eq!(state.unsure.len(), 1);
        assert_eq!(state.unsure[0].at.to_string(), "dlq:0:1");
    }

    #[test]
    fn a_loop_copy_in_the_last_batch_is_done() {
        let state = tally(&[
            batch_entry("dlq:0:0", "a/0", "0", "0:1"),
            entry(
                0,
                "dlq:0:1",
                &[
                    (ATTEMPT, "a/1"),
                    (BATCH, "0"),
                    (ENTRY, "loop"),
                    (REPLAYED_TO, "dlq"),
                ],
            ),
        ]);
        assert_eq!(state.done, refs(&["dlq:0:1"]));
        assert_eq!(state.unsure.len(), 1);
    }

    #[test]
    fn a_malformed_entry_of_the_run_is_refused_and_names_its_problem() {
        let run: RunId = "r1".parse().unwrap();
        let good = [
            (ATTEMPT, "a/3"),
            (BATCH, "2"),
            (ENTRY, "replay"),
            (REPLAYED_TO, "in"),
            (AFTER, "0:1"),
        ];
        let with =
            |key: &'static str, value: Option<&'static str>| -> Vec<(&'static str, &'static str)> {
                let mut h: Vec<(&str, &str)> =
                    good.iter().filter(|(k, _)| *k != key).copied().collect();
                if let Some(v) = value {
                    h.push((key, v));
                }
                h
            };
        assert!(
            entry_of(&entry(0, "dlq:0:1", &good), &run)
                .unwrap()
                .is_some()
        );
        let cases: Vec<(OwnedMessage, &str)> = vec![
            (
                entry(0, "nope", &good),
                "its key is not a dead-letter record",
            ),
            (
                entry(0, "dlq:0:1", &with(ATTEMPT, None)),
                "header hopper-replay-attempt is missing",
            ),
            (
                entry(0, "dlq:0:1", &with(ATTEMPT, Some("a3"))),
                "not ATTEMPT/N",
            ),
            (
                entry(0, "dlq:0:1", &with(ATTEMPT, Some("a/x"))),
                "not ATTEMPT/N",
            ),
            (
                entry(0, "dlq:0:1", &with(BATCH, Some("4"))),
                "header hopper-replay-batch is `4`",
            ),
            (
                entry(0, "dlq:0:1", &with(BATCH, Some("-1"))),
                "header hopper-replay-batch is `-1`",
            ),
            (
                entry(0, "dlq:0:1", &with(ENTRY, Some("twice"))),
                "not replay, redo or loop",
            ),
            (
                entry(0, "dlq:0:1", &with(REPLAYED_TO, None)),
                "header hopper-replayed-to is missing",
            ),
            (
                entry(0, "dlq:0:1", &with(AFTER, Some("0:1;1:2"))),
                "header hopper-replay-after: `0:1;1:2`",
            ),
        ];
        for (m, problem) in cases {
            let e = entry_of(&m, &run).unwrap_err();
            assert!(e.contains(problem), "{e}");
        }
        // Another run's entries are not read at all.
        let other: RunId = "r2".parse().unwrap();
        assert_eq!(entry_of(&entry(0, "nope", &[]), &other), Ok(None));
    }
}
