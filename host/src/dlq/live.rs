//! The admin server's dead-letter groups, kept current: one reader per
//! dead-letter topic follows it from its first record, and each record is
//! counted into its group ([`DlqSummary::group`]) as it arrives. The
//! console's groups view reads this tally, so opening it never scans a
//! topic.
//!
//! Memory is bounded by the number of groups, not of records: at most
//! [`MAX_LIVE_GROUPS`] groups, each with a sample error of at most 1 KiB,
//! its cause (160 characters), up to 8 versions and [`ARRIVAL_BUCKETS`]
//! arrival counts; records of further causes are counted as `other`. Which
//! records were replayed is not followed here (`hopper dlq groups` reads
//! the replay journal for that).

use super::browse::{Group, read_error, reader};
use super::record::DlqSummary;
use crate::kafka::Cluster;
use crate::lag;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Groups the live tally keeps apart; records of further causes count as
/// `other`.
pub const MAX_LIVE_GROUPS: usize = 10_000;

/// Bars in a group's sparkline of arrivals.
pub const ARRIVAL_BUCKETS: usize = 32;

/// The width of a sparkline's bar until its arrivals span more: it doubles
/// as often as needed.
const FIRST_BUCKET_MS: i64 = 60_000;

const HOUR_MS: i64 = 3_600_000;

/// How long a reader waits before trying a topic it could not read again.
const RETRY_EVERY: Duration = Duration::from_secs(5);

/// When a group's dead letters failed, as counts over [`ARRIVAL_BUCKETS`]
/// equal stretches from `start_ms`. The stretches start a minute wide and
/// double (two bars merging into one) whenever a later record would fall
/// past the last, so 32 numbers cover any span. A record that failed
/// before `start_ms` counts in the first bar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arrivals {
    pub start_ms: i64,
    pub bucket_ms: i64,
    pub counts: Vec<u32>,
}

impl Arrivals {
    fn new(at: i64) -> Arrivals {
        Arrivals {
            start_ms: at - at.rem_euclid(FIRST_BUCKET_MS),
            bucket_ms: FIRST_BUCKET_MS,
            counts: vec![0; ARRIVAL_BUCKETS],
        }
    }

    /// Counts one that failed at `at`; a time past an hour after `now`
    /// (a forged header) counts as that hour, so it cannot widen the bars
    /// until every real one is in the first.
    fn add(&mut self, at: i64, now: i64) {
        let at = at.min(now.saturating_add(HOUR_MS));
        let offset = at.saturating_sub(self.start_ms).max(0);
        loop {
            let bar = offset / self.bucket_ms;
            if bar < ARRIVAL_BUCKETS as i64 {
                self.counts[bar as usize] = self.counts[bar as usize].saturating_add(1);
                return;
            }
            let Some(wider) = self.bucket_ms.checked_mul(2) else {
                // A forged time near the end of i64: the last bar.
                let last = &mut self.counts[ARRIVAL_BUCKETS - 1];
                *last = last.saturating_add(1);
                return;
            };
            for bar in 0..ARRIVAL_BUCKETS / 2 {
                self.counts[bar] = self.counts[2 * bar].saturating_add(self.counts[2 * bar + 1]);
            }
            self.counts[ARRIVAL_BUCKETS / 2..].fill(0);
            self.bucket_ms = wider;
        }
    }
}

/// A group as the live view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveGroup {
    #[serde(flatten)]
    pub group: Group,
    pub arrivals: Arrivals,
}

/// How far a reader got through its topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Records read so far.
    pub read: usize,
    /// Whether it read every record that was there when it started; later
    /// ones are counted as they come.
    pub caught_up: bool,
    /// Why it cannot read the topic now, if it cannot; it tries again
    /// every few seconds.
    pub error: Option<String>,
}

/// The groups view: the groups of one route (or all), newest failure
/// first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LivePage {
    pub topics: BTreeMap<String, Progress>,
    /// Whether every topic was read to where it ended when its reader
    /// started.
    pub caught_up: bool,
    /// Records counted, of the route asked for.
    pub total: usize,
    /// Groups of the route asked for; `groups` holds the newest `limit`.
    pub group_count: usize,
    pub groups: Vec<LiveGroup>,
    /// Records past [`MAX_LIVE_GROUPS`] groups, in no group (every route).
    pub other: usize,
}

#[derive(Default)]
struct Tally {
    groups: HashMap<String, LiveGroup>,
    other: usize,
    topics: BTreeMap<String, Progress>,
}

/// The live tally of every dead-letter topic of a config.
#[derive(Default)]
pub struct LiveGroups {
    // std Mutex: held to count one record or copy a page, never across an
    // .await.
    tally: Mutex<Tally>,
}

impl LiveGroups {
    pub fn new() -> Arc<LiveGroups> {
        Arc::new(LiveGroups::default())
    }

    /// Counts one dead letter into its group.
    pub fn add(&self, s: &DlqSummary) {
        let mut tally = self.tally.lock().expect("live groups lock");
        let Tally { groups, other, .. } = &mut *tally;
        if !groups.contains_key(&s.group) && groups.len() >= MAX_LIVE_GROUPS {
            *other += 1;
            return;
        }
        let at = s.failed_at.unwrap_or_default();
        let live = groups.entry(s.group.clone()).or_insert_with(|| LiveGroup {
            group: Group::new(s, None),
            arrivals: Arrivals::new(at),
        });
        live.group.add(s);
        live.arrivals.add(at, crate::clock::now_ms());
    }

    fn progress(&self, topic: &str, change: impl FnOnce(&mut Progress)) {
        let mut tally = self.tally.lock().expect("live groups lock");
        change(tally.topics.entry(topic.to_string()).or_default());
    }

    /// The groups of `route` (every route with `None`), the most recently
    /// failed first, at most `limit` of them.
    pub fn page(&self, route: Option<&str>, limit: usize) -> LivePage {
        let tally = self.tally.lock().expect("live groups lock");
        let mut mine: Vec<&LiveGroup> = tally
            .groups
            .values()
            .filter(|g| route.is_none_or(|r| g.group.route.as_deref() == Some(r)))
            .collect();
        let total = mine.iter().map(|g| g.group.count).sum();
        let group_count = mine.len();
        mine.sort_unstable_by(|a, b| {
            (b.group.last_failed_at, &b.group.group).cmp(&(a.group.last_failed_at, &a.group.group))
        });
        LivePage {
            caught_up: tally.topics.values().all(|p| p.caught_up),
            topics: tally.topics.clone(),
            total,
            group_count,
            groups: mine.into_iter().take(limit).cloned().collect(),
            other: tally.other,
        }
    }

    /// Follows each of `topics` on a thread of the blocking pool until
    /// `stop`, counting every record into the tally.
    pub fn follow(
        self: &Arc<Self>,
        cluster: &Cluster,
        topics: impl IntoIterator<Item = String>,
        stop: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        topics
            .into_iter()
            .map(|topic| {
                self.progress(&topic, |_| {});
                let (live, cluster, stop) = (self.clone(), cluster.clone(), stop.clone());
                tokio::task::spawn_blocking(move || live.read(&cluster, &topic, &stop))
            })
            .collect()
    }

    /// Reads `topic` from its start, then as records come, until `stop`.
    /// A topic it cannot read (missing, refused) is tried again.
    fn read(&self, cluster: &Cluster, topic: &str, stop: &CancellationToken) {
        let mut logged = None::<Instant>;
        while !stop.is_cancelled() {
            let Err(e) = self.read_until_error(cluster, topic, stop) else {
                return;
            };
            let message = e.to_string();
            if logged.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(topic, error = %message, "Cannot follow a dead-letter topic for the groups view; trying again.");
                logged = Some(Instant::now());
            }
            self.progress(topic, |p| p.error = Some(message));
            let deadline = Instant::now() + RETRY_EVERY;
            while Instant::now() < deadline && !stop.is_cancelled() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn read_until_error(
        &self,
        cluster: &Cluster,
        topic: &str,
        stop: &CancellationToken,
    ) -> Result<(), super::DlqError> {
        let consumer: BaseConsumer<_> = reader(cluster, topic)?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = HashMap::new();
        for p in lag::partitions(&consumer, topic)? {
            let (_, high) = lag::watermarks(&consumer, topic, p)?;
            if high > 0 {
                ends.insert(p, high);
            }
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|source| read_error(topic, source))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|source| read_error(topic, source))?;
        self.progress(topic, |p| {
            p.error = None;
            p.caught_up = ends.is_empty();
        });
        while !stop.is_cancelled() {
            let Some(result) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = result.map_err(|source| read_error(topic, source))?;
            self.add(&DlqSummary::of(&message, 0));
            let (partition, offset) = (message.partition(), message.offset());
            let done = ends.get(&partition).is_some_and(|end| offset + 1 >= *end);
            if done {
                ends.remove(&partition);
            }
            let caught_up = ends.is_empty();
            self.progress(topic, |p| {
                p.read += 1;
                p.caught_up = caught_up;
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::RecordRef;

    fn summary(route: &str, error: &str, failed_at: i64, offset: i64) -> DlqSummary {
        let cause = crate::dlq::fingerprint::cause(error);
        DlqSummary {
            at: RecordRef {
                topic: format!("{route}.dlq"),
                partition: 0,
                offset,
            },
            timestamp: Some(failed_at),
            failed_at: Some(failed_at),
            id: None,
            route: Some(route.to_string()),
            reason: Some(crate::headers::Reason::Fatal),
            error: Some(error.to_string()),
            group: crate::dlq::fingerprint::group(route, "FATAL", &cause),
            cause,
            attempt: Some(1),
            handler_version: Some("0123456789abcdef".into()),
            key: None,
            payload_bytes: 0,
            replays_before: 0,
            replayed: 0,
        }
    }

    #[test]
    fn records_of_one_cause_are_one_group_with_their_newest_error() {
        let live = LiveGroups::new();
        for i in 0..30 {
            live.add(&summary(
                "orders",
                &format!("order o-{i} is unknown"),
                1_000 + i,
                i,
            ));
            live.add(&summary("orders", "told to fail", 1_000 + i, 100 + i));
            live.add(&summary("payments", "told to fail", 1_000 + i, 200 + i));
        }
        let page = live.page(Some("orders"), 100);
        assert_eq!((page.total, page.group_count, page.other), (60, 2, 0));
        let unknown = page
            .groups
            .iter()
            .find(|g| g.group.cause == "order o-<n> is unknown")
            .unwrap();
        assert_eq!(unknown.group.count, 30);
        assert_eq!(
            unknown.group.sample.as_deref(),
            Some("order o-29 is unknown")
        );
        assert_eq!(unknown.group.not_replayed, None);
        assert_eq!(unknown.arrivals.counts[0], 30);
        assert_eq!(live.page(None, 100).group_count, 3);
        assert_eq!(live.page(None, 1).groups.len(), 1);
    }

    /// 100,000 distinct causes: the tally keeps [`MAX_LIVE_GROUPS`] groups
    /// and counts the rest.
    #[test]
    fn past_the_cap_records_count_as_other() {
        let live = LiveGroups::new();
        for i in 0..100_000i64 {
            // Letters, not digits: each is a cause of its own.
            let word: String = format!("{i:x}")
                .chars()
                .map(|c| (b'g' + c.to_digit(16).unwrap() as u8) as char)
                .collect();
            live.add(&summary("orders", &format!("{word} failed"), i, i));
        }
        let page = live.page(None, usize::MAX);
        assert_eq!(page.group_count, MAX_LIVE_GROUPS);
        assert_eq!(page.other, 100_000 - MAX_LIVE_GROUPS);
        assert_eq!(page.total + page.other, 100_000);
    }

    #[test]
    fn arrivals_widen_to_cover_any_span_and_keep_every_count() {
        const T: i64 = 1_765_000_020_000;
        let start = T - T % 60_000;
        let now = start + 2 * HOUR_MS;
        let mut a = Arrivals::new(T);
        assert_eq!(a.start_ms, start);
        for minute in 0..32 {
            a.add(start + minute * 60_000, now);
        }
        assert_eq!(a.bucket_ms, 60_000);
        assert!(a.counts.iter().all(|c| *c == 1));
        // One an hour later: two bars merge into one, two minutes wide.
        a.add(start + 60 * 60_000, now);
        assert_eq!(a.bucket_ms, 2 * 60_000);
        assert_eq!(a.counts.iter().sum::<u32>(), 33);
        assert_eq!((a.counts[0], a.counts[15], a.counts[30]), (2, 2, 1));
        // Before the start: the first bar. A forged time at the end of
        // i64 counts an hour past now, which three hours cover.
        a.add(0, now);
        a.add(i64::MAX, now);
        assert_eq!(a.counts.iter().sum::<u32>(), 35);
        assert_eq!(a.bucket_ms, 8 * 60_000);
        assert_eq!(a.counts[0], 9);
        assert_eq!(a.counts[(3 * 60 / 8) as usize], 1);
    }
}
