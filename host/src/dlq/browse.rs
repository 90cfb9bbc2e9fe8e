//! Reading dead-letter topics: list with filters and pages, one record in
//! full, and the replay journal that says how often each was replayed.
//!
//! Kafka has no index to search, so a list reads every record of the
//! selected DLQ topics, from the low to the high watermark as they were when
//! the list began, and keeps a short summary of each match. A list stops
//! after [`MAX_SCAN`] records and says so. Everything here blocks on the
//! brokers; async callers run it on the blocking pool.

use super::record::{DlqRecord, DlqSummary, RecordRef};
use super::run::{self, RunId};
use crate::config::{Config, RELAY_ROUTE, replay_journal};
use crate::headers::Reason;
use crate::kafka::{Cluster, WatchedContext};
use crate::lag::{self, LagError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Records one list reads at most, over all its topics.
pub const MAX_SCAN: usize = 200_000;
/// How long reading a topic may go without a record before it is given
/// up: a read of any size goes on while records come.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a DLQ could not be read. Names the route, topic or record.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("route `{0}` is not in the config")]
    UnknownRoute(String),
    #[error("topic `{0}` is not a dead-letter topic of the config")]
    NotDeadLetterTopic(String),
    #[error("record {0} does not exist")]
    NotFound(RecordRef),
    #[error("cannot create a client to read `{topic}`: {source}")]
    Client {
        topic: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("cannot read `{topic}`: {source}")]
    Read {
        topic: String,
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "no record of `{topic}` came for {READ_TIMEOUT:?} after {read} of {expected}; the broker is too slow or gone"
    )]
    Timeout {
        topic: String,
        read: usize,
        expected: i64,
    },
    #[error(
        "{matched} records match, more than the {max} one request takes (replay.max_records, or `--max` of `hopper dlq try`): narrow the selection. A replay of a filter alone (`hopper dlq replay`, or `POST /api/replay` with only a `filter`) is a run of any size, which can resume"
    )]
    TooMany { matched: usize, max: usize },
    #[error("cannot create the replay producer: {0}")]
    Producer(String),
    #[error(transparent)]
    Lag(#[from] LagError),
}

/// Which records a list or a replay selects. Every field narrows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqFilter {
    /// Records of this route (`delay`: the delay relay's).
    pub route: Option<String>,
    /// `hopper-reason`, such as FATAL.
    pub reason: Option<String>,
    /// Failed at or after this time, epoch ms.
    pub since: Option<i64>,
    /// Failed before this time, epoch ms.
    pub until: Option<i64>,
    /// The key, exactly.
    pub key: Option<String>,
    /// Text in the last error, case-insensitive.
    pub text: Option<String>,
    /// The group of one cause ([`DlqSummary::group`]), as `dlq groups`
    /// lists it.
    #[serde(default)]
    pub group: Option<String>,
    /// Only records never replayed (by the replay journal).
    #[serde(default)]
    pub not_replayed: bool,
}

impl DlqFilter {
    /// What is wrong with the filter, naming the field: a reason that is
    /// not one of hopper's classes would silently match nothing.
    pub fn check(&self) -> Result<(), String> {
        match self.reason.as_deref().filter(|r| !r.is_empty()) {
            Some(reason) if Reason::parse(reason).is_none() => {
                let known: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
                Err(format!(
                    "reason: `{reason}` is not a reason class; one of {}",
                    known.join(", ")
                ))
            }
            _ => Ok(()),
        }
    }

    pub fn matches(&self, s: &DlqSummary) -> bool {
        let eq = |want: &Option<String>, got: &Option<String>| {
            want.as_ref()
                .is_none_or(|w| w.is_empty() || got.as_deref() == Some(w.as_str()))
        };
        let failed = s.failed_at.unwrap_or(0);
        eq(&self.route, &s.route)
            && self
                .reason
                .as_deref()
                .is_none_or(|w| w.is_empty() || s.reason.is_some_and(|r| r.as_str() == w))
            && eq(&self.key, &s.key)
            && self.since.is_none_or(|t| failed >= t)
            && self.until.is_none_or(|t| failed < t)
            && self.text.as_ref().is_none_or(|t| {
                let error = s.error.as_deref().unwrap_or_default().to_lowercase();
                error.contains(&t.to_lowercase())
            })
            && self
                .group
                .as_deref()
                .is_none_or(|g| g.is_empty() || g == s.group)
            && (!self.not_replayed || s.replayed == 0)
    }
}

/// The dead letters of one cause ([`DlqSummary::group`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub group: String,
    pub route: Option<String>,
    pub reason: Option<Reason>,
    /// The last error with its variable parts taken out.
    pub cause: String,
    pub count: usize,
    /// Of them, never replayed (by the replay journal); not kept by the
    /// admin server's live groups ([`super::live`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_replayed: Option<usize>,
    /// When the first and the last of them failed, epoch ms.
    pub first_failed_at: Option<i64>,
    pub last_failed_at: Option<i64>,
    /// The handler versions that dead-lettered them, at most
    /// [`MAX_GROUP_VERSIONS`] (12 hex digits each).
    pub versions: BTreeSet<String>,
    /// One of their errors as written: the newest.
    pub sample: Option<String>,
    /// Where that one is.
    pub sample_record: RecordRef,
}

impl Group {
    /// An empty group of `s`'s cause; `not_replayed` is `Some(0)` to
    /// count them.
    pub fn new(s: &DlqSummary, not_replayed: Option<usize>) -> Group {
        Group {
            group: s.group.clone(),
            route: s.route.clone(),
            reason: s.reason,
            cause: s.cause.clone(),
            count: 0,
            not_replayed,
            first_failed_at: s.failed_at,
            last_failed_at: s.failed_at,
            versions: BTreeSet::new(),
            sample: s.error.clone(),
            sample_record: s.at.clone(),
        }
    }

    /// Counts `s` in: its time, its version, and its error as the sample
    /// when it is the newest.
    pub fn add(&mut self, s: &DlqSummary) {
        self.count += 1;
        if let Some(n) = &mut self.not_replayed {
            *n += usize::from(s.replayed == 0);
        }
        self.first_failed_at = match (self.first_failed_at, s.failed_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if s.failed_at >= self.last_failed_at {
            self.last_failed_at = s.failed_at;
            self.sample.clone_from(&s.error);
            self.sample_record.clone_from(&s.at);
        }
        if let Some(v) = &s.handler_version
            && self.versions.len() < MAX_GROUP_VERSIONS
        {
            // Most records carry a version the group has: no new string.
            let short = v
                .char_indices()
                .nth(12)
                .map_or(v.as_str(), |(i, _)| &v[..i]);
            if !self.versions.contains(short) {
                self.versions.insert(short.to_string());
            }
        }
    }
}

impl Group {
    /// Counts `other`, a tally of the same cause from other partitions, in.
    pub fn merge(&mut self, other: Group) {
        self.count += other.count;
        if let (Some(n), Some(more)) = (&mut self.not_replayed, other.not_replayed) {
            *n += more;
        }
        self.first_failed_at = match (self.first_failed_at, other.first_failed_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if (other.last_failed_at, &other.sample_record) > (self.last_failed_at, &self.sample_record)
        {
            self.last_failed_at = other.last_failed_at;
            self.sample = other.sample;
            self.sample_record = other.sample_record;
        }
        for v in other.versions {
            if self.versions.len() >= MAX_GROUP_VERSIONS {
                break;
            }
            self.versions.insert(v);
        }
    }
}

/// Dead letters counted into groups, at most [`MAX_GROUPS`] of them; the
/// rest are `other`.
#[derive(Default)]
struct Tally {
    groups: HashMap<String, Group>,
    scanned: usize,
    total: usize,
    other: usize,
}

impl Tally {
    fn add(&mut self, s: &DlqSummary) {
        self.total += 1;
        if let Some(g) = self.groups.get_mut(&s.group) {
            g.add(s);
        } else if self.groups.len() >= MAX_GROUPS {
            self.other += 1;
        } else {
            let mut g = Group::new(s, Some(0));
            g.add(s);
            self.groups.insert(s.group.clone(), g);
        }
    }

    /// `other`'s counts added to these; its groups past the cap count as
    /// `other` here.
    fn merge(&mut self, other: Tally) {
        self.total += other.total;
        self.other += other.other;
        for (id, g) in other.groups {
            if let Some(mine) = self.groups.get_mut(&id) {
                mine.merge(g);
            } else if self.groups.len() >= MAX_GROUPS {
                self.other += g.count;
            } else {
                self.groups.insert(id, g);
            }
        }
    }
}

/// Versions a group lists; past them, the rest are not named.
pub const MAX_GROUP_VERSIONS: usize = 8;

/// Groups a scan keeps apart; past them, records are counted as `other`.
pub const MAX_GROUPS: usize = 10_000;

/// The groups of the records a filter matches, most recent first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupsPage {
    pub topics: Vec<String>,
    /// Records read: every record of the topics, since a group's memory
    /// does not grow with its records.
    pub scanned: usize,
    /// Records that matched the filter.
    pub total: usize,
    pub groups: Vec<Group>,
    /// Matches past [`MAX_GROUPS`] groups, in no group.
    pub other: usize,
}

/// Dead letters of one reason class in one stretch of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    pub start_ms: i64,
    pub counts: BTreeMap<String, usize>,
}

/// One page of a list.
#[derive(Debug, Clone, Serialize)]
pub struct DlqPage {
    /// The topics read.
    pub topics: Vec<String>,
    pub scanned: usize,
    /// Reading stopped at [`MAX_SCAN`] records; later ones were not read.
    pub truncated: bool,
    /// Records that match the filter.
    pub total: usize,
    pub skip: usize,
    /// The matches from `skip` on, newest failure first.
    pub records: Vec<DlqSummary>,
    /// Every match, counted by reason per stretch of `bucket_ms`.
    pub bucket_ms: i64,
    pub histogram: Vec<Bucket>,
}

/// The dead-letter topics of a config, read through its brokers.
pub struct Dlq<'a> {
    pub cluster: &'a Cluster,
    pub config: &'a Config,
}

impl Dlq<'_> {
    /// The DLQ topics `route` writes, or every one with no route.
    pub fn topics(&self, route: Option<&str>) -> Result<Vec<String>, DlqError> {
        let Some(route) = route.filter(|r| !r.is_empty()) else {
            return Ok(self.config.dead_letter_topics().into_iter().collect());
        };
        if route == RELAY_ROUTE
            && let Some(relay) = &self.config.delay
        {
            return Ok(vec![relay.dlq.clone()]);
        }
        match self.config.routes.iter().find(|r| r.name == route) {
            Some(r) => Ok(vec![r.dlq.clone()]),
            None => Err(DlqError::UnknownRoute(route.to_string())),
        }
    }

    fn check_topic(&self, topic: &str) -> Result<(), DlqError> {
        if self.config.dead_letter_topics().contains(topic) {
            Ok(())
        } else {
            Err(DlqError::NotDeadLetterTopic(topic.to_string()))
        }
    }

    /// The matches of `filter`, newest failure first, from `skip`, at most
    /// `limit`.
    pub fn list(&self, filter: &DlqFilter, skip: usize, limit: usize) -> Result<DlqPage, DlqError> {
        let topics = self.topics(filter.route.as_deref())?;
        let mut matches = Vec::new();
        let (mut scanned, mut truncated) = (0, false);
        for topic in &topics {
            let replayed = replay_counts(self.cluster, topic)?;
            let budget = MAX_SCAN - scanned;
            let read = read_until(self.cluster, topic, &HashMap::new(), budget, |m| {
                let summary = summary_of(m, &replayed);
                if filter.matches(&summary) {
                    matches.push(summary);
                }
                true
            })?;
            scanned += read.0;
            truncated |= read.1;
        }
        matches.sort_by(|a, b| (b.failed_at, &b.at).cmp(&(a.failed_at, &a.at)));
        let (bucket_ms, histogram) = histogram(&matches);
        Ok(DlqPage {
            topics,
            scanned,
            truncated,
            total: matches.len(),
            skip,
            records: matches.into_iter().skip(skip).take(limit).collect(),
            bucket_ms,
            histogram,
        })
    }

    /// The matches of `filter` grouped by cause, the most recently failed
    /// group first. Reads every record, with no scan limit: memory grows
    /// with groups (at most [`MAX_GROUPS`]), not records.
    pub fn groups(&self, filter: &DlqFilter) -> Result<GroupsPage, DlqError> {
        let topics = self.topics(filter.route.as_deref())?;
        let mut all = Tally::default();
        for topic in &topics {
            let replayed = replay_counts(self.cluster, topic)?;
            // A topic's partitions, shared out to a reader thread per core:
            // summing up a record costs more than reading it.
            let partitions = lag::partitions(&reader(self.cluster, topic)?, topic)?;
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, partitions.len().max(1));
            let shares: Vec<Vec<i32>> = (0..threads)
                .map(|t| {
                    partitions
                        .iter()
                        .copied()
                        .skip(t)
                        .step_by(threads)
                        .collect()
                })
                .collect();
            let tallies = std::thread::scope(|scope| {
                let readers: Vec<_> = shares
                    .iter()
                    .map(|share| {
                        let replayed = &replayed;
                        scope.spawn(move || {
                            let mut tally = Tally::default();
                            let only = Some(share.as_slice());
                            read_partitions(
                                self.cluster,
                                topic,
                                only,
                                &HashMap::new(),
                                usize::MAX,
                                |m| {
                                    let s = summary_of(m, replayed);
                                    if filter.matches(&s) {
                                        tally.add(&s);
                                    }
                                    true
                                },
                            )
                            .map(|(read, _)| (read, tally))
                        })
                    })
                    .collect();
                readers
                    .into_iter()
                    .map(|r| r.join().expect("a grouping reader panicked"))
                    .collect::<Vec<_>>()
            });
            for tally in tallies {
                let (read, tally) = tally?;
                all.scanned += read;
                all.merge(tally);
            }
        }
        let mut groups: Vec<Group> = all.groups.into_values().collect();
        groups.sort_by(|a, b| (b.last_failed_at, &b.group).cmp(&(a.last_failed_at, &a.group)));
        Ok(GroupsPage {
            topics,
            scanned: all.scanned,
            total: all.total,
            groups,
            other: all.other,
        })
    }

    /// Every match of `filter`, as the records themselves, in offset order
    /// per partition. More than `max` matches is an error: a replay takes
    /// all of its selection or nothing.
    pub fn select(&self, filter: &DlqFilter, max: usize) -> Result<Vec<OwnedMessage>, DlqError> {
        let mut out = Vec::new();
        let (_, matched) = self.for_each_match(filter, MAX_SCAN, |_, m| {
            if out.len() < max {
                out.push(m);
            }
        })?;
        if matched > max {
            return Err(DlqError::TooMany { matched, max });
        }
        Ok(out)
    }

    /// Passes every match of `filter` to `each` as it is read, in offset
    /// order per partition, keeping none: a selection of any size. Reads
    /// at most `budget` records per topic. Returns the records read and
    /// matched.
    pub fn for_each_match(
        &self,
        filter: &DlqFilter,
        budget: usize,
        mut each: impl FnMut(DlqSummary, OwnedMessage),
    ) -> Result<(usize, usize), DlqError> {
        self.for_each_match_but(filter, budget, None, |s, m| {
            each(s, m);
            true
        })
    }

    /// [`Dlq::for_each_match`], with the replays of run `except` not
    /// counted (a resumed run selects what it selected at first), and
    /// stopping once `each` returns false.
    pub fn for_each_match_but(
        &self,
        filter: &DlqFilter,
        budget: usize,
        except: Option<&RunId>,
        mut each: impl FnMut(DlqSummary, OwnedMessage) -> bool,
    ) -> Result<(usize, usize), DlqError> {
        let (mut scanned, mut matched) = (0, 0);
        let mut go_on = true;
        for topic in self.topics(filter.route.as_deref())? {
            if !go_on {
                break;
            }
            let replayed = replay_counts_but(self.cluster, &topic, except)?;
            let read = read_until(self.cluster, &topic, &HashMap::new(), budget, |m| {
                let summary = summary_of(m, &replayed);
                if filter.matches(&summary) {
                    matched += 1;
                    go_on = each(summary, m.detach());
                }
                go_on
            })?;
            scanned += read.0;
        }
        Ok((scanned, matched))
    }

    /// One record in full.
    pub fn show(&self, at: &RecordRef) -> Result<DlqRecord, DlqError> {
        let message = self.fetch(at)?;
        let replayed = replay_counts(self.cluster, &at.topic)?;
        let mut record = DlqRecord::of(&message, replayed.get(at).copied().unwrap_or(0));
        record.trace_url = match (&self.config.tracing, &record.trace_id) {
            (Some(tracing), Some(trace_id)) => tracing.link(trace_id),
            _ => None,
        };
        Ok(record)
    }

    /// The record at `at`, which must be in a DLQ topic of the config.
    pub fn fetch(&self, at: &RecordRef) -> Result<OwnedMessage, DlqError> {
        self.check_topic(&at.topic)?;
        let consumer = reader(self.cluster, &at.topic)?;
        let (low, high) = lag::watermarks(&consumer, &at.topic, at.partition)?;
        if at.offset < low || at.offset >= high {
            return Err(DlqError::NotFound(at.clone()));
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&at.topic, at.partition, Offset::Offset(at.offset))
            .map_err(|source| read_error(&at.topic, source))?;
        consumer
            .assign(&tpl)
            .map_err(|source| read_error(&at.topic, source))?;
        let deadline = Instant::now() + READ_TIMEOUT;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.offset() == at.offset => return Ok(m.detach()),
                // A compacted or transactional gap: the offset holds no record.
                Some(Ok(m)) if m.offset() > at.offset => break,
                Some(Ok(_)) | None => {}
                Some(Err(source)) => return Err(read_error(&at.topic, source)),
            }
        }
        Err(DlqError::NotFound(at.clone()))
    }
}

pub(crate) fn read_error(topic: &str, source: rdkafka::error::KafkaError) -> DlqError {
    DlqError::Read {
        topic: topic.to_string(),
        source,
    }
}

/// A consumer that reads by assignment and never commits.
pub(crate) fn reader(
    cluster: &Cluster,
    topic: &str,
) -> Result<BaseConsumer<WatchedContext>, DlqError> {
    let mut config = cluster.consumer_config(crate::config::DLQ_READER_GROUP);
    config
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    // `fetch.queue.backoff.ms` comes from `consumer_config`, as for every
    // consumer: a reader takes records as fast as they come.
    config
        .create_with_context(cluster.watched("dead-letter reader"))
        .map_err(|source| DlqError::Client {
            topic: topic.to_string(),
            source,
        })
}

/// The summary of `m`, with its replays from `replayed` (its topic's
/// journal).
fn summary_of(m: &BorrowedMessage<'_>, replayed: &HashMap<RecordRef, u32>) -> DlqSummary {
    let mut s = DlqSummary::of(m, 0);
    s.replayed = replayed.get(&s.at).copied().unwrap_or(0);
    s
}

/// Reads `topic` from its low to its high watermarks (as they are now),
/// passing each record to `each`, at most `budget` records. Returns the
/// records read and whether the budget cut the read short.
pub fn read_all(
    cluster: &Cluster,
    topic: &str,
    budget: usize,
    each: impl FnMut(OwnedMessage),
) -> Result<(usize, bool), DlqError> {
    read_from(cluster, topic, &HashMap::new(), budget, each)
}

/// [`read_all`], starting each partition of `from` at its offset there
/// (or at its low watermark, when that is later).
pub fn read_from(
    cluster: &Cluster,
    topic: &str,
    from: &HashMap<i32, i64>,
    budget: usize,
    mut each: impl FnMut(OwnedMessage),
) -> Result<(usize, bool), DlqError> {
    read_until(cluster, topic, from, budget, |m| {
        each(m.detach());
        true
    })
}

/// [`read_from`], stopping early when `each` returns false (the read is
/// then not truncated: the caller stopped it).
fn read_until(
    cluster: &Cluster,
    topic: &str,
    from: &HashMap<i32, i64>,
    budget: usize,
    each: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> Result<(usize, bool), DlqError> {
    read_partitions(cluster, topic, None, from, budget, each)
}

/// [`read_until`], of the partitions `only` names (`None`: every one).
fn read_partitions(
    cluster: &Cluster,
    topic: &str,
    only: Option<&[i32]>,
    from: &HashMap<i32, i64>,
    budget: usize,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> Result<(usize, bool), DlqError> {
    let consumer = reader(cluster, topic)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    let mut expected = 0;
    let partitions = match only {
        Some(only) => only.to_vec(),
        None => lag::partitions(&consumer, topic)?,
    };
    for p in partitions {
        let (low, high) = lag::watermarks(&consumer, topic, p)?;
        let low = from.get(&p).map_or(low, |start| low.max(*start));
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(|source| read_error(topic, source))?;
            ends.insert(p, high);
            expected += high - low;
        }
    }
    if ends.is_empty() {
        return Ok((0, false));
    }
    consumer
        .assign(&tpl)
        .map_err(|source| read_error(topic, source))?;
    // Since when no record was counted: the clock is read only while the
    // read stalls, not once per record.
    let mut stalled: Option<Instant> = None;
    let mut read = 0;
    while !ends.is_empty() {
        if read >= budget {
            return Ok((read, true));
        }
        let counted = match consumer.poll(Duration::from_millis(100)) {
            None => false,
            Some(result) => {
                let m = result.map_err(|source| read_error(topic, source))?;
                let (partition, offset) = (m.partition(), m.offset());
                let end = ends.get(&partition).copied().unwrap_or(i64::MIN);
                if offset + 1 >= end {
                    ends.remove(&partition);
                }
                if offset < end {
                    read += 1;
                    if !each(&m) {
                        return Ok((read, false));
                    }
                }
                offset < end
            }
        };
        if counted {
            stalled = None;
        } else if stalled.get_or_insert_with(Instant::now).elapsed() > READ_TIMEOUT {
            return Err(DlqError::Timeout {
                topic: topic.to_string(),
                read,
                expected,
            });
        }
    }
    Ok((read, false))
}

/// How often each record of dead-letter topic `dlq` was replayed, from its
/// replay journal (`<dlq>.replays`). No journal: nothing was replayed.
pub fn replay_counts(cluster: &Cluster, dlq: &str) -> Result<HashMap<RecordRef, u32>, DlqError> {
    replay_counts_but(cluster, dlq, None)
}

/// [`replay_counts`] without the replays of run `except`. An entry that
/// redoes a replay which was never produced, or records a REPLAY_LOOP
/// copy, is no replay (docs/operations.md).
pub fn replay_counts_but(
    cluster: &Cluster,
    dlq: &str,
    except: Option<&RunId>,
) -> Result<HashMap<RecordRef, u32>, DlqError> {
    let journal = replay_journal(dlq);
    let mut counts = HashMap::new();
    let read = read_all(cluster, &journal, usize::MAX, |m| {
        if !run::counts_as_replay(&m) || except.is_some_and(|e| run::run_of(&m) == Some(e.as_str()))
        {
            return;
        }
        let at = m
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| k.parse::<RecordRef>().ok());
        if let Some(at) = at {
            *counts.entry(at).or_insert(0) += 1;
        }
    });
    match read {
        Ok(_) | Err(DlqError::Lag(LagError::Missing { .. })) => Ok(counts),
        Err(e) => Err(e),
    }
}

/// Matches counted by reason per stretch of time: about 30 stretches over
/// the span of the matches, each a round length.
fn histogram(matches: &[DlqSummary]) -> (i64, Vec<Bucket>) {
    const ROUND: [i64; 10] = [
        1_000,
        10_000,
        60_000,
        300_000,
        900_000,
        3_600_000,
        21_600_000,
        86_400_000,
        604_800_000,
        2_592_000_000,
    ];
    let times: Vec<i64> = matches.iter().filter_map(|m| m.failed_at).collect();
    let (Some(first), Some(last)) = (times.iter().min(), times.iter().max()) else {
        return (ROUND[0], Vec::new());
    };
    // Times come from headers: saturating, so a hostile one cannot overflow.
    let span = last.saturating_sub(*first);
    let width = ROUND
        .into_iter()
        .find(|w| span / w < 30)
        .unwrap_or(ROUND[ROUND.len() - 1]);
    let mut buckets: BTreeMap<i64, BTreeMap<String, usize>> = BTreeMap::new();
    for m in matches {
        let Some(at) = m.failed_at else { continue };
        let reason = m.reason.map_or("NONE", Reason::as_str).to_string();
        *buckets
            .entry(at.saturating_sub(at.rem_euclid(width)))
            .or_default()
            .entry(reason)
            .or_default() += 1;
    }
    let buckets = buckets
        .into_iter()
        .map(|(start_ms, counts)| Bucket { start_ms, counts })
        .collect();
    (width, buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(partition: i32, offset: i64, failed_at: i64, version: &str) -> DlqSummary {
        let cause = super::super::fingerprint::cause("order o-1 unknown");
        DlqSummary {
            at: RecordRef {
                topic: "orders.dlq".into(),
                partition,
                offset,
            },
            timestamp: Some(failed_at),
            failed_at: Some(failed_at),
            id: None,
            route: Some("orders".into()),
            reason: Some(Reason::Fatal),
            error: Some(format!("order o-{offset} unknown")),
            group: super::super::fingerprint::group("orders", "FATAL", &cause),
            cause,
            attempt: None,
            handler_version: Some(version.into()),
            key: None,
            payload_bytes: 0,
            replays_before: 0,
            replayed: u32::from(offset == 0),
        }
    }

    #[test]
    fn tallies_of_two_partitions_merge_into_what_one_reader_counts() {
        let records = [
            summary(0, 0, 10, "a"),
            summary(1, 0, 30, "b"),
            summary(0, 1, 20, "a"),
            summary(1, 1, 5, "c"),
        ];
        let mut one = Tally::default();
        let (mut left, mut right) = (Tally::default(), Tally::default());
        for s in &records {
            one.add(s);
            if s.at.partition == 0 {
                &mut left
            } else {
                &mut right
            }
            .add(s);
        }
        left.merge(right);
        assert_eq!((left.total, left.other), (4, 0));
        let (merged, whole) = (
            &left.groups[&records[0].group],
            &one.groups[&records[0].group],
        );
        assert_eq!(merged.count, 4);
        assert_eq!(merged.not_replayed, Some(2));
        assert_eq!(
            (merged.first_failed_at, merged.last_failed_at),
            (Some(5), Some(30))
        );
        assert_eq!(merged.sample.as_deref(), Some("order o-0 unknown"));
        assert_eq!(merged.sample_record.partition, 1);
        assert_eq!(
            (merged.count, merged.not_replayed, &merged.versions),
            (whole.count, whole.not_replayed, &whole.versions)
        );
        assert_eq!(merged.sample_record, whole.sample_record);
    }

    #[test]
    fn past_the_cap_a_merged_tally_counts_the_rest_as_other() {
        let mut all = Tally::default();
        for i in 0..MAX_GROUPS {
            let mut s = summary(0, i as i64, 1, "a");
            s.group = format!("g{i}");
            all.add(&s);
        }
        let mut more = Tally::default();
        for i in 0..3 {
            let mut s = summary(1, i, 1, "a");
            s.group = format!("new{}", i % 2);
            more.add(&s);
        }
        let mut known = summary(1, 9, 1, "a");
        known.group = "g0".into();
        more.add(&known);
        all.merge(more);
        assert_eq!(all.groups.len(), MAX_GROUPS);
        assert_eq!((all.total, all.other), (MAX_GROUPS + 4, 3));
        assert_eq!(all.groups["g0"].count, 2);
    }
}
