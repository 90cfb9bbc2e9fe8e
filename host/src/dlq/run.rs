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
//! writes its entries in order (its [`ATTEMPT`] header counts them), one
//! record at a time, so only an attempt's last entry can be one whose
//! replay was not produced. A resume reads the destination of each such
//! record from the end offsets its entry wrote down ([`AFTER`]) and replays
//! it only when no record of the run replayed from it is there.

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
/// On a journal entry: the destination's end offsets, `partition:offset`
/// separated by commas, read before the replay was produced.
pub const AFTER: &str = "hopper-replay-after";
/// On a journal entry: `replay`, `redo` (the replay of a record whose first
/// entry's replay was never produced: not counted again) or `loop` (a
/// REPLAY_LOOP copy: not a replay).
pub const ENTRY: &str = "hopper-replay-entry";
/// On a journal entry: where the record was replayed to.
pub const REPLAYED_TO: &str = "hopper-replayed-to";

/// Longest run id.
const MAX_RUN_ID: usize = 64;

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

/// One journal entry of the run.
struct Entry {
    at: RecordRef,
    attempt: String,
    n: u64,
    kind: String,
    to: String,
    after: String,
}

impl RunState {
    /// Reads the run's entries in the journals of dead-letter topics
    /// `dlqs`.
    pub fn load(cluster: &Cluster, dlqs: &[String], run: &RunId) -> Result<RunState, DlqError> {
        let mut state = RunState::default();
        // Entries per record, and each attempt's last entry.
        let mut count: HashMap<RecordRef, u32> = HashMap::new();
        let mut last: HashMap<String, Entry> = HashMap::new();
        for dlq in dlqs {
            let read = read_all(cluster, &replay_journal(dlq), usize::MAX, |m| {
                let Some(entry) = entry_of(&m, run) else {
                    return;
                };
                state.entries += 1;
                *count.entry(entry.at.clone()).or_insert(0) += 1;
                match last.get(&entry.attempt) {
                    Some(e) if e.n >= entry.n => {}
                    _ => {
                        last.insert(entry.attempt.clone(), entry);
                    }
                }
            });
            match read {
                Ok(_) | Err(DlqError::Lag(crate::lag::LagError::Missing { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        // A record is unsure when each of its entries ended an attempt;
        // a REPLAY_LOOP copy is never produced again (the record is in its
        // dead-letter topic either way).
        let mut lasts: HashMap<RecordRef, Vec<Entry>> = HashMap::new();
        for entry in last.into_values() {
            lasts.entry(entry.at.clone()).or_default().push(entry);
        }
        for (at, entries) in lasts {
            let all_last = count.get(&at).copied().unwrap_or(0) as usize == entries.len();
            if !all_last || entries.iter().any(|e| e.kind == "loop") {
                continue;
            }
            count.remove(&at);
            let mut after: HashMap<i32, i64> = HashMap::new();
            for (p, o) in entries.iter().flat_map(|e| parse_after(&e.after)) {
                let o = after.get(&p).map_or(o, |was| o.min(*was));
                after.insert(p, o);
            }
            state.unsure.push(Unsure {
                at,
                to: entries[0].to.clone(),
                after,
            });
        }
        state.done = count.into_keys().collect();
        Ok(state)
    }
}

/// The entry `m` of the journal, if it is one of `run`'s.
fn entry_of(m: &OwnedMessage, run: &RunId) -> Option<Entry> {
    let text = |key| {
        headers::text(m.headers(), key)
            .ok()
            .flatten()
            .map(str::to_string)
    };
    if text(RUN).as_deref() != Some(run.as_str()) {
        return None;
    }
    let at = std::str::from_utf8(m.key()?).ok()?.parse().ok()?;
    let attempt = text(ATTEMPT)?;
    let (attempt, n) = attempt.rsplit_once('/')?;
    Some(Entry {
        at,
        attempt: attempt.to_string(),
        n: n.parse().ok()?,
        kind: text(ENTRY).unwrap_or_else(|| "replay".into()),
        to: text(REPLAYED_TO)?,
        after: text(AFTER).unwrap_or_default(),
    })
}

/// `partition:offset,...` as [`AFTER`] holds it.
pub fn after_text(ends: &[(i32, i64)]) -> String {
    ends.iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_after(text: &str) -> Vec<(i32, i64)> {
    text.split(',')
        .filter_map(|po| {
            let (p, o) = po.split_once(':')?;
            Some((p.trim().parse().ok()?, o.trim().parse().ok()?))
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
        assert_eq!(parse_after(&text), vec![(0, 12), (3, 7)]);
        assert_eq!(parse_after(""), vec![]);
        assert_eq!(parse_after("x:1,2:y,4:5"), vec![(4, 5)]);
    }
}
