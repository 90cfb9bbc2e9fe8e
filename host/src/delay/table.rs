//! The cancellation table: every cancel and replace the relay group has
//! read, as every relay process knows them.
//!
//! The relay that reads a cancel (or a replace) from its inbox writes an
//! entry to the cancellation topic (key: the id; value: where the inbox read
//! it). Every relay process reads the whole topic, with no consumer group,
//! into this table, as a Kafka Streams GlobalKTable, so a due message is
//! checked just before it is forwarded whichever process read its cancel.
//! The table holds one entry per id and inbox partition with a pending
//! cancellation, never one per scheduled message; an entry goes once
//! nothing it covers can still be due
//! ([`crate::config::DelayRelay::cancel_lifetime`]).
//!
//! It is bounded (`[delay] max_cancellations`): a relay refuses a cancel
//! that would add an entry to a full table ([`CancelTable::admits`]), and
//! the sweep that drops expired entries holds the lock the veto of a
//! forward takes for [`SWEEP_SLICE`] entries at a time, never for the whole table.
//!
//! On start the table is read to the end of the topic before the relay
//! forwards anything ([`CancelTable::load`] returns only then).

use super::cancel::{entry_key_id, entry_key_partition};
use super::entries::{Entries, Entry};
use crate::clock::now_ms;
use crate::events::{self, Event, Telemetry};
use crate::headers;
use crate::hop::{OutRecord, Outcome};
use crate::kafka::compacted;
use crate::kafka::{Cluster, KafkaError as Error};
use crate::produce::Veto;
use crate::types::{CancelKind, InboxPosition};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How many recent forwards a process remembers (fingerprints only, so the
/// memory is fixed, about 2 MB), to tell a cancel that came too late.
const RECENT_FORWARDS: usize = 65_536;
/// How often expired entries are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How many entries the sweep looks at each time it takes the table's
/// lock, which the veto of a forward waits for: 13 µs a slice at the median,
/// 104 µs at most, where a sweep of a million entries under one lock held
/// the veto for 3.6 ms (BENCHMARKS.md, `cancel-bound`), and for longer the
/// more entries a table held.
pub const SWEEP_SLICE: usize = 4_096;
/// Names the topic in errors.
const WHAT: &str = "cancellation topic";
/// The least room the table keeps past `max_cancellations` for entries
/// other relay processes admitted at the same moment.
pub const CEILING_ROOM: usize = 1_024;

/// What [`CancelTable::get`] reports of an entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CancelView {
    pub kind: CancelKind,
    /// Where the inbox read the cancel: it covers the id's schedules read
    /// before this offset of this partition.
    pub partition: i32,
    pub offset: i64,
    pub expires_at: i64,
    /// Schedules this process dropped because of it.
    pub dropped: u32,
}

/// Ids this process forwarded lately (with their inbox partition), and
/// where each was read: a fixed number of fingerprints, the oldest
/// forgotten first.
struct Recent {
    hasher: RandomState,
    order: VecDeque<u64>,
    at: HashMap<u64, InboxPosition>,
}

impl Recent {
    fn new() -> Recent {
        Recent {
            hasher: RandomState::new(),
            order: VecDeque::new(),
            at: HashMap::new(),
        }
    }

    fn remember(&mut self, id: &[u8], at: InboxPosition) {
        let print = self.hasher.hash_one((at.partition, id));
        if self.at.insert(print, at).is_none() {
            self.order.push_back(print);
        }
        while self.order.len() > RECENT_FORWARDS {
            if let Some(old) = self.order.pop_front() {
                self.at.remove(&old);
            }
        }
    }

    fn forwarded(&self, partition: i32, id: &[u8]) -> Option<InboxPosition> {
        self.at.get(&self.hasher.hash_one((partition, id))).copied()
    }
}

/// The cancellations every relay process shares.
pub struct CancelTable {
    /// std Mutex: no .await while it is held; each use is a map operation.
    entries: Mutex<Entries>,
    recent: Mutex<Recent>,
    /// This process, in the entries it writes (`hopper-cancel-by`).
    me: String,
    lifetime_ms: i64,
    /// `[delay] max_cancellations`: past it, [`CancelTable::admits`]
    /// refuses a cancel of an id the table does not hold.
    max: usize,
    /// The most entries the table keeps, whoever wrote them: `max` plus
    /// room for the cancels other relay processes admitted in the moment
    /// before theirs reached this table.
    ceiling: usize,
    topic: String,
    telemetry: Telemetry,
}

impl CancelTable {
    /// An empty table with no bound; [`CancelTable::load`] fills it, and
    /// [`LoadedTable::follow`] follows it.
    pub fn new(topic: &str, lifetime: Duration, telemetry: Telemetry) -> CancelTable {
        CancelTable {
            entries: Mutex::new(Entries::new()),
            recent: Mutex::new(Recent::new()),
            me: format!("{:016x}", RandomState::new().hash_one(std::process::id())),
            lifetime_ms: i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX),
            max: usize::MAX,
            ceiling: usize::MAX,
            topic: topic.to_string(),
            telemetry,
        }
    }

    /// The same table, refusing new ids past `max` entries
    /// ([`CancelTable::admits`]) and keeping at most `max` plus a sixteenth
    /// (at least [`CEILING_ROOM`] more) from the topic.
    pub fn bounded(mut self, max: usize) -> CancelTable {
        self.max = max;
        self.ceiling = max.saturating_add((max / 16).max(CEILING_ROOM));
        self
    }

    /// The configured bound (`[delay] max_cancellations`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// This process's id in the entries it writes.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The cancellation topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pending cancellations of `id`, one per inbox partition that
    /// read a cancel of it, by partition.
    pub fn get(&self, id: &[u8]) -> Vec<CancelView> {
        let partitions = self.entries.lock().unwrap().partitions();
        // A lock per partition: a veto waits for one lookup at most.
        (0..partitions)
            .filter_map(|partition| {
                let entries = self.entries.lock().unwrap();
                entries.get(partition, id).map(|e| CancelView {
                    kind: e.kind,
                    partition: e.at.partition,
                    offset: e.at.offset,
                    expires_at: e.expires_at,
                    dropped: e.dropped,
                })
            })
            .collect()
    }

    /// Whether a cancel of `id` read from inbox `partition` may be
    /// recorded: the table holds an entry of it there (the cancel only
    /// moves it), or has room for one more. Else how many entries it holds.
    pub fn admits(&self, partition: i32, id: &str) -> Result<(), usize> {
        let entries = self.entries.lock().unwrap();
        if entries.len() < self.max || entries.get(partition, id.as_bytes()).is_some() {
            Ok(())
        } else {
            Err(entries.len())
        }
    }

    /// Whether a cancellation covers the schedule of `id` read at
    /// `schedule`, and what kind; counted as dropped when it does. Only a
    /// cancel read from the schedule's own inbox partition, after it, does
    /// (docs/headers.md); the caller checks that the schedule's key is its
    /// id.
    pub fn covering(&self, id: &str, schedule: InboxPosition) -> Option<CancelKind> {
        let mut entries = self.entries.lock().unwrap();
        let entry = entries.get_mut(schedule.partition, id.as_bytes())?;
        if !entry.at.covers(schedule) {
            return None;
        }
        entry.dropped = entry.dropped.saturating_add(1);
        Some(entry.kind)
    }

    /// Takes in one record of the cancellation topic. An entry keeps the
    /// highest position of its id in its inbox partition; an entry already
    /// expired is not kept, nor one past the table's ceiling.
    pub fn apply<M: Message>(&self, record: &M) {
        let Some(raw_key) = record.key() else { return };
        let recorded_at = record.timestamp().to_millis().unwrap_or_else(now_ms);
        let Some(value) = record.payload() else {
            // A tombstone.
            if let Some((partition, id)) = entry_key_partition(raw_key) {
                self.entries.lock().unwrap().remove(partition, id);
                self.gauge();
            }
            return;
        };
        let at = std::str::from_utf8(value)
            .ok()
            .and_then(InboxPosition::parse);
        // The key is `<partition>:<id>`, the partition the value's.
        let key = at.and_then(|at| entry_key_id(raw_key, at.partition));
        let kind = headers::text(record.headers(), headers::CANCEL_KIND)
            .ok()
            .flatten()
            .and_then(CancelKind::parse);
        let (Some(at), Some(key), Some(kind)) = (at, key, kind) else {
            tracing::warn!(
                topic = self.topic,
                partition = record.partition(),
                offset = record.offset(),
                "Cancellation entry not understood; skipped."
            );
            return;
        };
        let mine = headers::text(record.headers(), headers::CANCEL_BY)
            .ok()
            .flatten()
            == Some(self.me.as_str());
        let expires_at = recorded_at.saturating_add(self.lifetime_ms);
        if expires_at <= now_ms() {
            return;
        }
        let too_late = self
            .recent
            .lock()
            .unwrap()
            .forwarded(at.partition, key)
            .is_some_and(|forwarded| at.covers(forwarded));
        {
            let mut entries = self.entries.lock().unwrap();
            let known = entries.get(at.partition, key).copied();
            if let Some(known) = known
                && known.at.offset >= at.offset
            {
                return;
            }
            if known.is_none() && entries.len() >= self.ceiling {
                let held = entries.len();
                drop(entries);
                self.telemetry.emit(events::CancellationNotKept {
                    id: String::from_utf8_lossy(key).into_owned(),
                    inbox: at,
                    entries: held,
                });
                return;
            }
            // A later cancel of the id extends the earlier one: what that
            // one dropped, and whether it came too late, still count.
            let entry = Entry {
                at,
                expires_at,
                dropped: known.map_or(0, |k| k.dropped),
                kind,
                mine,
                too_late: too_late || known.is_some_and(|k| k.too_late),
            };
            if entries.insert(key, entry).is_err() {
                let held = entries.len();
                drop(entries);
                self.telemetry.emit(events::CancellationNotKept {
                    id: String::from_utf8_lossy(key).into_owned(),
                    inbox: at,
                    entries: held,
                });
                return;
            }
        }
        self.gauge();
        let id = String::from_utf8_lossy(key).into_owned();
        if too_late {
            self.telemetry.emit(events::CancelTooLate {
                id: id.clone(),
                kind,
            });
        }
        if self.telemetry.has_observers() {
            self.telemetry.emit(events::CancellationKnown {
                id,
                kind,
                inbox: at,
                recorded_at,
            });
        }
    }

    /// Drops the entries that expired by `now`, a slice at a time.
    pub fn sweep(&self, now: i64) {
        let mut below = usize::MAX;
        while below > 0 {
            below = self.sweep_slice(now, below);
        }
    }

    /// As [`CancelTable::sweep`], letting other tasks run between slices.
    pub async fn sweep_yielding(&self, now: i64) {
        let mut below = usize::MAX;
        while below > 0 {
            below = self.sweep_slice(now, below);
            tokio::task::yield_now().await;
        }
    }

    /// Drops the entries that expired by `now` among the [`SWEEP_SLICE`]
    /// below place `below` (`usize::MAX`: the last ones), holding the lock
    /// for that slice only; returns where the next slice starts (0: done).
    /// Entries added or moved meanwhile wait for the next sweep, a second
    /// later; an expired entry still held covers only schedules that can
    /// no longer be due.
    pub fn sweep_slice(&self, now: i64, below: usize) -> usize {
        let (expired, next) =
            self.entries
                .lock()
                .unwrap()
                .sweep_slice(below, SWEEP_SLICE, |entry| entry.expires_at > now);
        if !expired.is_empty() {
            self.report_expired(expired);
        }
        next
    }

    fn report_expired(&self, expired: Vec<(Vec<u8>, Entry)>) {
        self.gauge();
        for (id, entry) in expired {
            self.telemetry.emit(events::CancellationExpired {
                id: String::from_utf8_lossy(&id).into_owned(),
                kind: entry.kind,
                dropped: entry.dropped,
                unknown_id: entry.mine && entry.dropped == 0 && !entry.too_late,
            });
        }
    }

    fn gauge(&self) {
        let len = self.len();
        self.telemetry.metrics().set_cancellations(len);
    }

    /// Creates the cancellation topic when it is missing and the config
    /// allows it: compacted (one entry per id), and deleting what is older
    /// than an entry's lifetime. Returns whether it created it.
    pub async fn ensure_topic(
        cluster: &Cluster,
        topic: &str,
        lifetime: Duration,
    ) -> Result<bool, Error> {
        compacted::ensure_topic(cluster, WHAT, topic, Some(lifetime)).await
    }

    /// Reads the cancellation topic to its end into a new table. Nothing
    /// follows the topic until [`LoadedTable::follow`].
    pub async fn load(
        cluster: &Cluster,
        topic: &str,
        lifetime: Duration,
        max: usize,
        telemetry: Telemetry,
    ) -> Result<LoadedTable, Error> {
        let table = Arc::new(CancelTable::new(topic, lifetime, telemetry).bounded(max));
        let (reader, _) = compacted::reader(cluster, WHAT, topic)?;
        let started = std::time::Instant::now();
        compacted::read_to_end(&reader, WHAT, topic, |record| table.apply(record)).await?;
        table.gauge();
        tracing::info!(
            topic,
            entries = table.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "Cancellation table loaded."
        );
        Ok(LoadedTable { table, reader })
    }
}

/// A table read to the end of its topic, with the reader that goes on from
/// there once it follows.
pub struct LoadedTable {
    pub table: Arc<CancelTable>,
    reader: compacted::TableReader,
}

impl LoadedTable {
    /// Keeps following the topic (and dropping expired entries) until
    /// `shutdown`.
    pub fn follow(self, shutdown: CancellationToken) -> Arc<CancelTable> {
        let LoadedTable { table, reader } = self;
        let following = table.clone();
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = sweep.tick() => following.sweep_yielding(now_ms()).await,
                    record = reader.recv() => match record {
                        Ok(record) => following.apply(&record),
                        Err(KafkaError::PartitionEOF(_)) => {}
                        Err(e) => {
                            tracing::warn!(topic = following.topic, error = %e, "Reading the cancellation topic failed; retrying.");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                }
            }
        });
        table
    }
}

/// The pending cancellations of `id` as the cancellation topic has them
/// now, one per inbox partition: `hopper delay show`, without a running
/// relay. Reads the whole topic.
pub async fn lookup(
    cluster: &Cluster,
    topic: &str,
    lifetime: Duration,
    id: &str,
) -> Result<Vec<CancelView>, Error> {
    let table = CancelTable::new(topic, lifetime, Telemetry::new());
    let (consumer, _) = compacted::reader(cluster, WHAT, topic)?;
    compacted::read_to_end(&consumer, WHAT, topic, |record| {
        let of_id = record
            .key()
            .and_then(entry_key_partition)
            .is_some_and(|(_, key_id)| key_id == id.as_bytes());
        if of_id {
            table.apply(record);
        }
    })
    .await?;
    Ok(table.get(id.as_bytes()))
}

/// The forward of a due message is checked just before it is produced: a
/// cancellation read meanwhile drops it. Only a schedule whose key is its
/// id can be cancelled (docs/headers.md).
impl Veto for CancelTable {
    fn veto(&self, record: &OutRecord, outcome: &Outcome) -> Option<Event> {
        let forward = outcome.forward()?;
        let inbox = forward.inbox?;
        if record.key.as_deref() != Some(forward.id.as_bytes()) {
            return None;
        }
        match self.covering(&forward.id, inbox) {
            Some(kind) => Some(
                events::ScheduleCancelled {
                    id: forward.id.clone(),
                    target: forward.target.clone(),
                    deliver_at: forward.deliver_at,
                    kind,
                    inbox,
                }
                .into(),
            ),
            None => {
                self.recent
                    .lock()
                    .unwrap()
                    .remember(forward.id.as_bytes(), inbox);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

    fn entry(id: &str, at: &str, kind: &str, by: &str, time: i64) -> OwnedMessage {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: headers::CANCEL_KIND,
                value: Some(kind),
            })
            .insert(Header {
                key: headers::CANCEL_BY,
                value: Some(by),
            });
        let partition: i32 = at.split(':').next().unwrap().parse().unwrap();
        OwnedMessage::new(
            Some(at.as_bytes().to_vec()),
            Some(crate::delay::entry_key(partition, id)),
            "hopper.delay.cancels".into(),
            Timestamp::CreateTime(time),
            0,
            0,
            Some(headers),
        )
    }

    fn at(partition: i32, offset: i64) -> InboxPosition {
        InboxPosition { partition, offset }
    }

    #[tokio::test]
    async fn a_cancel_covers_what_was_read_before_it_in_its_partition() {
        let table = CancelTable::new("c", Duration::from_secs(60), Telemetry::new());
        let now = now_ms();
        table.apply(&entry("o-1", "1:10", "cancel", "other", now));
        assert_eq!(table.covering("o-1", at(1, 9)), Some(CancelKind::Cancel));
        assert_eq!(table.covering("o-1", at(1, 10)), None, "not itself");
        assert_eq!(
            table.covering("o-1", at(1, 11)),
            None,
            "not what came after"
        );
        assert_eq!(
            table.covering("o-1", at(0, 5)),
            None,
            "not another partition"
        );
        assert_eq!(table.covering("o-2", at(1, 9)), None);
        // A later cancel extends it; an older one read late does not shrink it.
        table.apply(&entry("o-1", "1:20", "replace", "other", now));
        table.apply(&entry("o-1", "1:15", "cancel", "other", now));
        assert_eq!(table.covering("o-1", at(1, 19)), Some(CancelKind::Replace));
        assert_eq!(table.get(b"o-1")[0].dropped, 2);
        assert_eq!(table.len(), 1);
    }

    /// Regression (hardening, "one cancel can undo another"): the table
    /// kept one entry per id, and an entry read from another partition
    /// replaced it.
    #[tokio::test]
    async fn a_cancel_from_another_partition_does_not_undo_one() {
        let table = CancelTable::new("c", Duration::from_secs(60), Telemetry::new());
        let now = now_ms();
        table.apply(&entry("inv-42", "1:10", "cancel", "other", now));
        table.apply(&entry("inv-42", "0:20", "cancel", "other", now));
        assert_eq!(table.covering("inv-42", at(1, 9)), Some(CancelKind::Cancel));
        assert_eq!(
            table.covering("inv-42", at(0, 19)),
            Some(CancelKind::Cancel)
        );
        assert_eq!(table.covering("inv-42", at(0, 20)), None);
        assert_eq!(table.covering("inv-42", at(1, 10)), None);
    }

    /// Past its bound the table admits no new id, but still one it holds;
    /// past its ceiling it keeps no entry it reads, and counts each.
    #[tokio::test]
    async fn a_bounded_table_admits_no_new_id_when_full_and_keeps_none_past_its_ceiling() {
        let telemetry = Telemetry::new();
        let table = CancelTable::new("c", Duration::from_secs(60), telemetry.clone()).bounded(2);
        let mut events = telemetry.subscribe();
        let now = now_ms();
        table.apply(&entry("a", "0:1", "cancel", "other", now));
        assert_eq!(table.admits(0, "b"), Ok(()));
        table.apply(&entry("b", "0:2", "cancel", "other", now));
        assert_eq!(table.admits(0, "c"), Err(2), "a new id");
        assert_eq!(
            table.admits(1, "a"),
            Err(2),
            "a held id in another partition"
        );
        assert_eq!(table.admits(0, "a"), Ok(()), "a held id moves its entry");
        // Entries other relays admitted at the same moment are kept, up to
        // the ceiling.
        for n in 0..CEILING_ROOM {
            table.apply(&entry(&format!("x-{n}"), "1:1", "cancel", "other", now));
        }
        assert_eq!(table.len(), 2 + CEILING_ROOM);
        table.apply(&entry("over", "1:1", "cancel", "other", now));
        assert_eq!(table.len(), 2 + CEILING_ROOM);
        assert!(table.get(b"over").is_empty());
        table.apply(&entry("a", "0:9", "cancel", "other", now));
        assert_eq!(table.get(b"a")[0].offset, 9, "a held entry still moves");
        let mut not_kept = Vec::new();
        while let Ok(event) = events.try_recv() {
            if let Event::CancellationNotKept(e) = event {
                not_kept.push(e.id);
            }
        }
        assert_eq!(not_kept, ["over"]);
    }

    /// The sweep holds the lock the veto of a forward takes for one slice
    /// at a time: each slice looks at no more than `SWEEP_SLICE` entries,
    /// and between two slices the veto gets in.
    #[tokio::test]
    async fn the_sweep_lets_the_veto_in_between_slices() {
        let table = CancelTable::new("c", Duration::from_secs(10), Telemetry::new());
        let now = now_ms();
        let total = 3 * SWEEP_SLICE + 5;
        for n in 0..total {
            table.apply(&entry(&format!("id-{n}"), "0:5", "cancel", "other", now));
        }
        table.apply(&entry("held", "1:5", "cancel", "other", now + 60_000));
        let expired = now + 10_000;
        let mut below = usize::MAX;
        let mut slices = 0;
        while below > 0 {
            let before = table.len();
            below = table.sweep_slice(expired, below);
            slices += 1;
            assert!(before - table.len() <= SWEEP_SLICE);
            // The veto, between two slices: the lock is free.
            assert!(table.entries.try_lock().is_ok());
            assert_eq!(table.covering("held", at(1, 4)), Some(CancelKind::Cancel));
        }
        assert_eq!(slices, total.div_ceil(SWEEP_SLICE));
        assert_eq!(table.len(), 1);
    }

    #[tokio::test]
    async fn an_entry_expires_and_counts_an_unknown_id_where_it_was_read() {
        let telemetry = Telemetry::new();
        let table = CancelTable::new("c", Duration::from_secs(10), telemetry.clone());
        let mut events = telemetry.subscribe();
        let now = now_ms();
        let me = table.me().to_string();
        table.apply(&entry("unknown", "0:1", "cancel", &me, now));
        table.apply(&entry("elsewhere", "0:2", "cancel", "other", now));
        table.apply(&entry("used", "0:3", "cancel", &me, now));
        table.apply(&entry("old", "0:4", "cancel", &me, now - 11_000));
        assert_eq!(table.len(), 3, "an entry already expired is not kept");
        assert!(table.covering("used", at(0, 0)).is_some());
        table.sweep(now + 9_999);
        assert_eq!(table.len(), 3);
        table.sweep(now + 10_000);
        assert!(table.is_empty());
        let mut unknown = Vec::new();
        while let Ok(event) = events.try_recv() {
            if let Event::CancellationExpired(e) = event
                && e.unknown_id
            {
                unknown.push(e.id);
            }
        }
        assert_eq!(unknown, ["unknown"]);
    }

    #[tokio::test]
    async fn a_cancel_for_a_message_already_forwarded_here_is_too_late() {
        let telemetry = Telemetry::new();
        let table = CancelTable::new("c", Duration::from_secs(60), telemetry.clone());
        let forward = |id: &str, inbox| {
            Outcome::Forward(crate::hop::Forward {
                id: id.into(),
                target: "t".into(),
                deliver_at: 0,
                inbox: Some(inbox),
                trace: None,
            })
        };
        let record = |id: &str| OutRecord {
            topic: "t".into(),
            key: Some(id.as_bytes().to_vec()),
            payload: None,
            headers: OwnedHeaders::new(),
            timestamp: 0,
        };
        assert!(
            table
                .veto(&record("gone"), &forward("gone", at(0, 5)))
                .is_none()
        );
        let mut events = telemetry.subscribe();
        table.apply(&entry("gone", "0:6", "cancel", "other", now_ms()));
        assert!(matches!(
            events.try_recv(),
            Ok(Event::CancelTooLate(e)) if e.id == "gone"
        ));
        // And the veto stops a forward that a known cancel covers.
        table.apply(&entry("next", "0:9", "cancel", "other", now_ms()));
        let stopped = table.veto(&record("next"), &forward("next", at(0, 8)));
        assert!(matches!(
            stopped,
            Some(Event::ScheduleCancelled(e)) if e.id == "next" && e.kind == CancelKind::Cancel
        ));
        // Not a schedule keyed by another key, or by none.
        let mut other = record("next");
        other.key = Some(b"other".to_vec());
        assert!(table.veto(&other, &forward("next", at(0, 7))).is_none());
        other.key = None;
        assert!(table.veto(&other, &forward("next", at(0, 7))).is_none());
    }
}
