//! A route's park topic: read whole into its [`ParkTable`] at start and
//! followed from then on, and written, one acknowledged record at a time.

use super::records::{self, BadRecord, Head, Lane, Record};
use super::table::{Inputs, KeyState, KeyView, ParkTable, Refusal};
use crate::clock::now_ms;
use crate::config::{Parking, Route};
use crate::events::{self, Telemetry};
use crate::hop::{Halt, PlannedHop};
use crate::kafka::compacted::{self, TableReader};
use crate::kafka::{Cluster, Doing as _, KafkaError};
use crate::renewable::AwaitedProducer;
use crate::types::ReleaseCause;
use rdkafka::Message;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Names the topic in errors.
const WHAT: &str = "park topic";
/// How long one record may wait in the producer's queue.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a wait for the table to catch up looks at the reader's
/// position, besides each record read.
const CATCH_UP_LOOK: Duration = Duration::from_millis(100);
/// How long reading an input topic's partitions and ends may take.
const INPUT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between two tries of a record the broker refused.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a parked message's record waits for others to share its
/// produce request. Parked messages are not awaited in their key's turn,
/// so a linger costs them nothing but a later commit, and saves a request,
/// its wake-ups and its system calls per message. A request costs the
/// broker far more than the records in it: at 5 ms, with a tenth of the
/// keys parked, the broker spent about twice the CPU a message it does at
/// 50 ms, and hopper a sixth more (BENCHMARKS.md).
const PARK_LINGER_MS: &str = "50";

/// Why a park-topic operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ParkError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("route `{route}` has no ordered retries (retry_order = \"key\")")]
    NotOrdered { route: String },
    #[error("{lane} is not parked or blocked")]
    NotParked { lane: String },
    #[error("hopper is stopping: the release was not written; try again once it runs")]
    Stopping,
}

/// The broker refused a park-topic record for good (too large, not
/// allowed): trying again would never end.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the park topic refused the record for good: {error}")]
pub struct Refused {
    pub error: String,
}

/// hopper began to stop while a record was not yet acknowledged, and gave
/// it up: what needed it is left undone, as after a crash, and done again
/// after a restart.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("hopper is stopping: a record not yet acknowledged was given up")]
pub struct Stopping;

/// Why a park-topic record was not written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unwritten {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Stopping(#[from] Stopping),
}

/// What became of a hop [`Store::send`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Acknowledged where it was going.
    Written,
    /// Refused there for good (a tier that does not take a record that
    /// large, a topic not allowed), and dead-lettered in its place.
    DeadLettered,
}

/// A parked message's record, not acknowledged.
#[derive(Debug)]
pub enum NotParked {
    /// Refused for good: the message, taken back out of the table, to be
    /// dead-lettered.
    Refused(records::Parked, Refused),
    Stopping(Stopping),
}

/// A parked message's acknowledgement.
pub type ParkAck =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), NotParked>> + Send>>;

/// A head record's acknowledgement ([`Store::head`]).
pub type HeadAck =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Unwritten>> + Send>>;

/// In [`Store::unacked`], the offset of a lane's head record not yet
/// acknowledged ([`Store::head`]): a key has one head at a time.
const HEAD: i64 = i64::MIN;

/// A park-topic record as it is produced.
struct Out {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    headers: OwnedHeaders,
    partition: i32,
    timestamp: Option<i64>,
}

/// The reader's progress through the topic, for [`Store::caught_up`].
#[derive(Default)]
struct Progress {
    /// Per partition: the offset after the last record read.
    next: HashMap<i32, i64>,
    /// Per partition: end-of-partition events seen.
    ends: HashMap<i32, u64>,
}

/// A route's park table and what reads and writes its topic.
pub struct Store {
    pub table: ParkTable,
    producer: AwaitedProducer,
    /// The producer of the records not awaited in a key's turn, with a
    /// linger of its own: parked messages' ([`Store::park`]) and the heads
    /// of keys parked by a message read from the input ([`Store::head`]),
    /// so a key's head and the messages parked behind it reach the topic
    /// in that order. Every other record goes through `producer`, which
    /// has none, as its writer awaits it.
    parks: AwaitedProducer,
    /// The parked messages whose record is not acknowledged yet, by a hash
    /// of their key and their input offset, and the heads ([`HEAD`]). A
    /// key's job waits for its message's record before it handles it
    /// ([`Store::written`]), and a release for its head's
    /// ([`Store::resolved`]): what the other producer writes must not reach
    /// the topic before it.
    unacked: Mutex<std::collections::HashSet<(u64, i64)>>,
    acked: Notify,
    lanes: foldhash::fast::RandomState,
    reader: TableReader,
    /// The topic's partition count: a key's records all go to partition
    /// `input partition mod partitions`, so they keep their order.
    partitions: i32,
    /// This process, on every record it writes: the reader skips them, as
    /// they were applied when written.
    me: String,
    progress: Mutex<Progress>,
    progressed: Notify,
    refusals: Mutex<Refusals>,
    telemetry: Telemetry,
    /// The route's dead-letter topic: where a parked message's hop the
    /// broker refuses for good goes instead ([`Store::send`]).
    dlq: String,
    /// Cancelled when hopper begins to stop: a record not acknowledged by
    /// then is given up ([`Stopping`]).
    stopping: CancellationToken,
    /// The route's pipeline's halt: a dead letter the broker refuses for
    /// good stops it, as one from the pipeline's own producer does.
    pub halt: Arc<Halt>,
}

/// The refusals logged, for [`Store::refused`]: at most one line a second.
#[derive(Default)]
struct Refusals {
    last: Option<std::time::Instant>,
    unlogged: u64,
}

/// The route's input partitions and their ends now: the only lanes its
/// park topic may hold, and, read once the topic is, the offsets below
/// which a record read at start must be.
fn input_ends(reader: &TableReader, route: &Route) -> Result<Inputs, KafkaError> {
    let mut inputs = Inputs::new();
    for topic in &route.topics {
        let metadata = reader
            .fetch_metadata(Some(topic), INPUT_TIMEOUT)
            .doing(|| format!("reading the partitions of `{topic}`"))?;
        let count = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(0, |t| t.partitions().len() as i32);
        let mut ends = Vec::with_capacity(count as usize);
        for partition in 0..count {
            let (_, high) = reader
                .fetch_watermarks(topic, partition, INPUT_TIMEOUT)
                .doing(|| format!("reading the end of `{topic}`[{partition}]"))?;
            ends.push(high);
        }
        inputs.insert(topic.clone(), ends);
    }
    Ok(inputs)
}

/// A store read to the end of its topic, not yet following it.
pub struct LoadedTable(pub Arc<Store>);

/// Creates the park topic of `parking` when it is missing (compacted, kept
/// for ever: a key may be parked for as long as its head's retries take).
pub async fn ensure_topic(cluster: &Cluster, parking: &Parking) -> Result<bool, KafkaError> {
    compacted::ensure_topic(cluster, WHAT, &parking.topic, None).await
}

/// Reads the park topic of `route` to its end into a new table.
pub async fn load(
    cluster: &Cluster,
    route: &Route,
    telemetry: Telemetry,
) -> Result<LoadedTable, ParkError> {
    let parking = route
        .parking
        .as_ref()
        .ok_or_else(|| ParkError::NotOrdered {
            route: route.name.clone(),
        })?;
    let (reader, partitions) = compacted::reader(cluster, WHAT, &parking.topic)?;
    let inputs = input_ends(&reader, route)?;
    let table = ParkTable::new(
        &route.name,
        &parking.topic,
        parking.on_dead_letter,
        (parking.max_bytes, parking.max_key_bytes),
        inputs,
    );
    // Every record is awaited, most of them in a key's turn: a linger
    // would only add to each wait.
    let mut config = cluster.producer_config();
    config.set("linger.ms", "0");
    let producer = AwaitedProducer::new(config, &format!("route `{}`'s park topic", route.name))
        .doing(|| format!("creating the producer of `{}`", parking.topic))?;
    let mut config = cluster.producer_config();
    config.set("linger.ms", PARK_LINGER_MS);
    let parks = AwaitedProducer::new(config, &format!("route `{}`'s parked messages", route.name))
        .doing(|| format!("creating the producer of `{}`", parking.topic))?;
    let store = Arc::new(Store {
        table,
        producer,
        parks,
        unacked: Mutex::default(),
        acked: Notify::new(),
        lanes: foldhash::fast::RandomState::default(),
        reader,
        partitions: partitions.len() as i32,
        me: format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                std::process::id()
            )
        ),
        progress: Mutex::default(),
        progressed: Notify::new(),
        refusals: Mutex::default(),
        telemetry,
        dlq: route.dlq.clone(),
        stopping: CancellationToken::new(),
        halt: Arc::default(),
    });
    // The first record written waits for the topic's metadata otherwise,
    // with a partition's calls behind it.
    let warm = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer as _;
        for producer in [warm.producer.current(), warm.parks.current()] {
            let _ = producer
                .client()
                .fetch_metadata(Some(&warm.table.topic), Duration::from_secs(5));
        }
    })
    .await;
    let started = std::time::Instant::now();
    compacted::read_to_end(&store.reader, WHAT, &parking.topic, |record| {
        store.read(record)
    })
    .await?;
    // The inputs' ends once the topic is read: a record read was written
    // for a message read before them.
    let ends = input_ends(&store.reader, route)?;
    for (reason, dropped) in store.table.loaded(&ends) {
        if dropped > 0 {
            store.refused(reason, dropped as u64, None);
        }
    }
    let summary = store.table.summary();
    tracing::info!(
        route = route.name,
        topic = parking.topic,
        parked_keys = summary.parked_keys,
        blocked_keys = summary.blocked_keys,
        messages = summary.messages,
        took_ms = started.elapsed().as_millis() as u64,
        "Park table loaded."
    );
    Ok(LoadedTable(store))
}

impl LoadedTable {
    /// Keeps following the topic until `shutdown`.
    pub fn follow(self, shutdown: CancellationToken) -> Arc<Store> {
        let store = self.0;
        let following = store.clone();
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        following.stopping.cancel();
                        return;
                    }
                    _ = sweep.tick() => following.table.sweep(),
                    record = following.reader.recv() => match record {
                        Ok(record) => following.read(&record),
                        Err(ClientError::PartitionEOF(partition)) => following.ended(partition),
                        Err(e) => {
                            tracing::warn!(topic = following.table.topic, error = %e, "Reading the park topic failed; retrying.");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                }
            }
        });
        store
    }
}

/// The parked keys of `route`, as its park topic has them now: `hopper
/// parked list`, without a running hopper. Reads the whole topic.
pub async fn list(cluster: &Cluster, route: &Route) -> Result<Vec<KeyView>, ParkError> {
    let loaded = load(cluster, route, Telemetry::new()).await?;
    Ok(loaded.0.table.list())
}

/// Releases `lane` of `route`: `hopper parked release`, without a running
/// hopper. Returns the head it was parked or blocked behind.
pub async fn release(cluster: &Cluster, route: &Route, lane: &Lane) -> Result<String, ParkError> {
    let loaded = load(cluster, route, Telemetry::new()).await?;
    loaded.0.release(lane).await
}

/// What [`purge`] deleted of a lane: its records, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Purged {
    pub heads: usize,
    pub waiting: usize,
    pub releases: usize,
}

/// Deletes every record of `lane` in the park topic of `route`: `hopper
/// parked purge`, straight against the brokers, whatever a running hopper
/// makes of them. Reads the whole topic, records a table would refuse
/// included, and writes a tombstone for each record of the lane still
/// there: its waiting messages first, then its releases, then its head.
/// A running hopper reads the tombstones and forgets the key.
pub async fn purge(cluster: &Cluster, route: &Route, lane: &Lane) -> Result<Purged, ParkError> {
    let parking = route
        .parking
        .as_ref()
        .ok_or_else(|| ParkError::NotOrdered {
            route: route.name.clone(),
        })?;
    let (reader, _) = compacted::reader(cluster, WHAT, &parking.topic)?;
    // Per record key: the partition it is in and its kind, while live.
    let mut live: HashMap<(i32, Vec<u8>), u8> = HashMap::new();
    compacted::read_to_end(&reader, WHAT, &parking.topic, |record| {
        let Some(key) = record.key() else { return };
        let (_, headers) = written_by(record);
        let Ok(read) = records::read(Some(key), None, headers, None) else {
            return;
        };
        if read.lane() != lane {
            return;
        }
        let entry = (record.partition(), key.to_vec());
        match record.payload() {
            None => _ = live.remove(&entry),
            Some(_) => _ = live.insert(entry, key[0]),
        }
    })
    .await?;
    let producer = cluster
        .producer()
        .doing(|| format!("creating the producer of `{}`", parking.topic))?;
    let mut purged = Purged::default();
    let mut doomed: Vec<_> = live.into_iter().collect();
    doomed.sort_by_key(|(_, kind)| match kind {
        b'p' => 0,
        b'r' => 1,
        _ => 2,
    });
    for ((partition, key), kind) in doomed {
        let record = FutureRecord::<[u8], [u8]>::to(&parking.topic)
            .partition(partition)
            .key(&key)
            .headers(
                OwnedHeaders::new()
                    .insert(Header {
                        key: records::BY,
                        value: Some("purge"),
                    })
                    .insert(Header {
                        key: records::KEY,
                        value: Some(&lane.key),
                    }),
            );
        producer
            .send(record, SEND_TIMEOUT)
            .await
            .map_err(|(e, _)| e)
            .doing(|| format!("deleting a record of {lane} from `{}`", parking.topic))?;
        match kind {
            b'p' => purged.waiting += 1,
            b'r' => purged.releases += 1,
            _ => purged.heads += 1,
        }
    }
    Ok(purged)
}

/// A record's headers, as read.
type ReadHeaders = Vec<(String, Option<Vec<u8>>)>;

/// Who wrote a park-topic record (its first header, `hopper-park-by`;
/// empty if it has none), and the rest of its headers.
fn written_by(record: &BorrowedMessage<'_>) -> (Vec<u8>, ReadHeaders) {
    let mut headers: ReadHeaders = record
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    let by = match headers.first() {
        Some((name, _)) if name == records::BY => headers.remove(0).1.unwrap_or_default(),
        _ => Vec::new(),
    };
    (by, headers)
}

impl Store {
    /// Applies a record read from the topic, unless this process wrote it.
    fn read(&self, record: &BorrowedMessage<'_>) {
        {
            let mut progress = self.progress.lock().unwrap();
            progress
                .next
                .insert(record.partition(), record.offset() + 1);
        }
        self.progressed.notify_waiters();
        let (by, headers) = written_by(record);
        if by == self.me.as_bytes() {
            return;
        }
        let timestamp = record.timestamp().to_millis();
        let at = Some((record.partition(), record.offset()));
        match records::read(record.key(), record.payload(), headers, timestamp) {
            Ok(read) => {
                if let Err(refusal) = self.table.read(read) {
                    self.refused(refusal, 1, at);
                }
            }
            Err(BadRecord { what }) => {
                tracing::debug!(
                    topic = self.table.topic,
                    partition = record.partition(),
                    offset = record.offset(),
                    "Skipped a park-topic record that hopper did not write: it {what}."
                );
                self.refused(Refusal::Unreadable, 1, at);
            }
        }
    }

    /// Counts `count` records refused for `reason`, and logs them, at most
    /// once a second.
    fn refused(&self, reason: Refusal, count: u64, at: Option<(i32, i64)>) {
        let (logged, unlogged) = {
            let mut refusals = self.refusals.lock().unwrap();
            let now = std::time::Instant::now();
            if refusals
                .last
                .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
            {
                refusals.unlogged += count;
                (false, 0)
            } else {
                refusals.last = Some(now);
                (true, std::mem::take(&mut refusals.unlogged))
            }
        };
        self.telemetry.emit(events::ParkRecordsRefused {
            route: self.table.route.clone(),
            topic: self.table.topic.clone(),
            reason: reason.as_str(),
            count,
            at,
            unlogged,
            logged,
        });
    }

    fn ended(&self, partition: i32) {
        {
            let mut progress = self.progress.lock().unwrap();
            *progress.ends.entry(partition).or_default() += 1;
        }
        self.progressed.notify_waiters();
    }

    /// Waits until the table has read everything the topic held when this
    /// was called: what another process wrote for a partition before it
    /// gave it up is in the table before this process runs the partition.
    pub async fn caught_up(self: &Arc<Self>) -> Result<(), KafkaError> {
        let store = self.clone();
        let ends =
            tokio::task::spawn_blocking(move || compacted::ends(&store.reader, &store.table.topic))
                .await
                .expect("reading the ends does not panic")?;
        let before = self.progress.lock().unwrap().ends.clone();
        loop {
            let progressed = self.progressed.notified();
            let done = {
                let progress = self.progress.lock().unwrap();
                ends.iter().all(|(partition, high)| {
                    progress.next.get(partition).is_some_and(|n| n >= high)
                        || progress.ends.get(partition) > before.get(partition)
                        || *high == 0
                })
            };
            // The reader's own position covers a tail of records it never
            // returned (deleted by compaction) and an end it reached before
            // this was called.
            if done || self.positions_reach(&ends) {
                return Ok(());
            }
            let _ = tokio::time::timeout(CATCH_UP_LOOK, progressed).await;
        }
    }

    /// Whether the reader's position in every partition is at least `ends`.
    fn positions_reach(&self, ends: &[(i32, i64)]) -> bool {
        let Ok(positions) = self.reader.position() else {
            return false;
        };
        ends.iter().all(|(partition, high)| {
            *high == 0
                || positions
                    .find_partition(&self.table.topic, *partition)
                    .and_then(|p| match p.offset() {
                        rdkafka::Offset::Offset(at) => Some(at >= *high),
                        _ => None,
                    })
                    .unwrap_or(false)
        })
    }

    /// How `record` goes to the topic.
    fn out(&self, record: &Record) -> Out {
        let records::Encoded {
            key,
            value,
            headers,
            timestamp,
        } = records::encode(record);
        let partition = match record {
            Record::Head { lane, .. }
            | Record::Parked { lane, .. }
            | Record::Release { lane, .. } => lane.partition.rem_euclid(self.partitions.max(1)),
        };
        let mut owned = OwnedHeaders::new_with_capacity(headers.len() + 1).insert(Header {
            key: records::BY,
            value: Some(self.me.as_bytes()),
        });
        for (name, value) in &headers {
            owned = owned.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        Out {
            key,
            value,
            headers: owned,
            partition,
            timestamp,
        }
    }

    fn record<'a>(&'a self, out: &'a Out) -> FutureRecord<'a, [u8], [u8]> {
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.table.topic)
            .partition(out.partition)
            .key(&out.key)
            .headers(out.headers.clone());
        if let Some(value) = &out.value {
            record = record.payload(value);
        }
        if let Some(at) = out.timestamp {
            record = record.timestamp(at);
        }
        record
    }

    /// Produces `out` and waits for its acknowledgement, trying again,
    /// with a backoff, while the broker's refusal may pass; a refusal for
    /// good (classified as a hop's is, [`crate::produce::classify`]: a
    /// record too large, a topic not allowed) ends it, and so does hopper's
    /// stop.
    async fn deliver(&self, out: &Out) -> Result<(), Unwritten> {
        let mut failures = 0u32;
        loop {
            let sent = tokio::select! {
                sent = self.producer.send(self.record(out), SEND_TIMEOUT) => sent,
                () = self.stopping.cancelled() => return Err(Stopping.into()),
            };
            let Err(e) = sent else {
                return Ok(());
            };
            failures += 1;
            if let Some(code) = e.rdkafka_error_code()
                && matches!(
                    crate::produce::classify(code, failures),
                    crate::produce::Failure::TooLarge | crate::produce::Failure::Refused
                )
            {
                tracing::error!(
                    route = self.table.route,
                    topic = self.table.topic,
                    error = %e,
                    bytes = out.key.len() + out.value.as_ref().map_or(0, Vec::len),
                    "The park topic refused a record for good; not trying again."
                );
                return Err(Refused {
                    error: e.to_string(),
                }
                .into());
            }
            tracing::warn!(
                route = self.table.route,
                topic = self.table.topic,
                error = %e,
                failures,
                "Writing to the park topic failed; trying again."
            );
            self.back_off(failures).await?;
        }
    }

    /// Waits before the next try after `failures` in a row, unless hopper
    /// begins to stop meanwhile.
    async fn back_off(&self, failures: u32) -> Result<(), Stopping> {
        let wait = Duration::from_millis(50u64 << failures.min(7)).min(MAX_BACKOFF);
        tokio::select! {
            () = tokio::time::sleep(wait) => Ok(()),
            () = self.stopping.cancelled() => Err(Stopping),
        }
    }

    /// Writes `record`, waits for its acknowledgement (trying again as
    /// [`Store::deliver`] does), and applies it.
    async fn write(&self, record: Record) -> Result<(), Unwritten> {
        let out = self.out(&record);
        self.deliver(&out).await?;
        self.table.apply(record);
        Ok(())
    }

    /// Parks `lane` behind the message `id` (input offset `seq`), unless
    /// it is parked behind it already. Refused for good (a key too large
    /// for a record), the key is not parked: the message may not go to a
    /// retry tier. Given up at the stop, the message is left undone.
    pub async fn hold(&self, lane: &Lane, id: &str, seq: i64) -> Result<(), Unwritten> {
        if self
            .table
            .head_of(lane)
            .is_some_and(|(head, state)| head == id && state == KeyState::Parked)
        {
            return Ok(());
        }
        self.write(Record::Head {
            lane: lane.clone(),
            head: Some(Head {
                head: id.to_string(),
                seq,
                since: now_ms(),
            }),
        })
        .await?;
        self.telemetry.emit(events::KeyParked {
            route: self.table.route.clone(),
            lane: lane.clone(),
            head: id.to_string(),
        });
        Ok(())
    }

    /// Parks a message of `lane` read at `seq`: its record is enqueued
    /// and applied now, behind everything written of its key before it
    /// (the key's head was acknowledged before its first message parked;
    /// its parked messages share a producer and a partition), and the
    /// future returned ends once it is acknowledged. The table's bound is
    /// kept by its partitions reading nothing more while it is full
    /// ([`ParkTable::full`]), never here: a key's own job, which frees
    /// room, may be waiting for this message's turn to end. Refused for
    /// good, the message is taken back out of the table and returned, to be
    /// dead-lettered. Given up at the stop, it stays in the table: a job
    /// waiting for it ([`Store::written`]) gives up too.
    pub fn park(self: &Arc<Self>, lane: &Lane, seq: i64, message: records::Parked) -> ParkAck {
        let record = Record::Parked {
            lane: lane.clone(),
            seq,
            message: Some(message),
        };
        let out = self.out(&record);
        let tag = self.tag(lane, seq);
        self.unacked.lock().unwrap().insert(tag);
        let enqueued = self.parks.enqueue(self.record(&out)).ok();
        self.table.apply(record);
        self.telemetry.emit(events::MessageParked {
            route: self.table.route.clone(),
            lane: lane.clone(),
            offset: seq,
        });
        let store = self.clone();
        let lane = lane.clone();
        Box::pin(async move {
            match store.acknowledged(enqueued, &out).await {
                Ok(()) => {}
                Err(Unwritten::Refused(refused)) => {
                    // Out of the table before a job waiting on this
                    // acknowledgement looks: it must not hand on a
                    // message that is dead-lettered instead.
                    let message = store.table.take(&lane, seq);
                    store.unacked.lock().unwrap().remove(&tag);
                    store.acked.notify_waiters();
                    return message
                        .map_or(Ok(()), |message| Err(NotParked::Refused(message, refused)));
                }
                Err(Unwritten::Stopping(stopping)) => {
                    return Err(NotParked::Stopping(stopping));
                }
            }
            store.unacked.lock().unwrap().remove(&tag);
            store.acked.notify_waiters();
            Ok(())
        })
    }

    /// Parks `lane` behind the message `id` (input offset `seq`), read from
    /// the input and sent to a retry tier, unless it is parked behind it
    /// already: the head is applied to the table now, so the key's later
    /// messages park behind it, and its record is enqueued before theirs,
    /// on their producer and partition. The future returned ends once the
    /// record is acknowledged: the message's retry is produced only then,
    /// so the key is never free while its head waits in a tier. It is
    /// awaited beside the partition's calls: the head holds no call slot
    /// for its record's round trip. Refused for good (a key too large for
    /// a record), the head stays in the table: its caller dead-letters the
    /// message and releases the key ([`Store::resolved`]), so messages
    /// parked behind it meanwhile go on in order.
    pub fn head(self: &Arc<Self>, lane: &Lane, id: &str, seq: i64) -> HeadAck {
        if self
            .table
            .head_of(lane)
            .is_some_and(|(head, state)| head == id && state == KeyState::Parked)
        {
            return Box::pin(std::future::ready(Ok(())));
        }
        let record = Record::Head {
            lane: lane.clone(),
            head: Some(Head {
                head: id.to_string(),
                seq,
                since: now_ms(),
            }),
        };
        let out = self.out(&record);
        let tag = self.tag(lane, HEAD);
        self.unacked.lock().unwrap().insert(tag);
        let enqueued = self.parks.enqueue(self.record(&out)).ok();
        self.table.apply(record);
        let store = self.clone();
        let (lane, id) = (lane.clone(), id.to_string());
        Box::pin(async move {
            let written = store.acknowledged(enqueued, &out).await;
            store.unacked.lock().unwrap().remove(&tag);
            store.acked.notify_waiters();
            written?;
            store.telemetry.emit(events::KeyParked {
                route: store.table.route.clone(),
                lane,
                head: id,
            });
            Ok(())
        })
    }

    /// Waits for the acknowledgement of `out`, enqueued as `enqueued`;
    /// failed or not enqueued, it is written again as [`Store::deliver`]
    /// writes.
    async fn acknowledged(
        &self,
        enqueued: Option<rdkafka::producer::DeliveryFuture>,
        out: &Out,
    ) -> Result<(), Unwritten> {
        let acknowledged = match enqueued {
            Some(delivery) => tokio::select! {
                delivered = delivery => matches!(delivered, Ok(Ok(_))),
                () = self.stopping.cancelled() => return Err(Stopping.into()),
            },
            None => false,
        };
        if acknowledged {
            return Ok(());
        }
        // Failed for good, the producer of parked messages is replaced
        // before its next record; this one is written as any other is.
        self.parks.renew_if_failed();
        self.deliver(out).await
    }

    /// Raises a fatal error in both producers, through librdkafka's test
    /// interface. For tests of their replacement.
    pub(crate) fn raise_fatal(&self, reason: &str) {
        self.producer.raise_fatal(reason);
        self.parks.raise_fatal(reason);
    }

    /// How many times each producer was replaced, failed for good: the
    /// awaited records' and the parked messages'.
    pub(crate) fn renewals(&self) -> (u64, u64) {
        (self.producer.renewals(), self.parks.renewals())
    }

    fn tag(&self, lane: &Lane, seq: i64) -> (u64, i64) {
        (self.lanes.hash_one(lane), seq)
    }

    /// Waits until the record of the parked message `seq` of `lane` is
    /// acknowledged: what is done with the message (its hops, its
    /// record's deletion) then comes after it. Not acknowledged when hopper
    /// begins to stop, the message is left as it is.
    pub async fn written(&self, lane: &Lane, seq: i64) -> Result<(), Stopping> {
        self.acked_tag(self.tag(lane, seq)).await
    }

    /// Waits until the record of `tag` ([`Store::unacked`]) is
    /// acknowledged, or hopper begins to stop with it not acknowledged.
    async fn acked_tag(&self, tag: (u64, i64)) -> Result<(), Stopping> {
        loop {
            let acked = self.acked.notified();
            if !self.unacked.lock().unwrap().contains(&tag) {
                return Ok(());
            }
            tokio::select! {
                () = acked => {}
                () = self.stopping.cancelled() => {
                    if self.unacked.lock().unwrap().contains(&tag) {
                        return Err(Stopping);
                    }
                }
            }
        }
    }

    /// Deletes the waiting message `seq` of `lane`, handled or
    /// dead-lettered.
    pub async fn forget(&self, lane: &Lane, seq: i64) {
        let deletion = Record::Parked {
            lane: lane.clone(),
            seq,
            message: None,
        };
        if self.write(deletion.clone()).await.is_err() {
            // Logged: it is forgotten here, and read again at a restart.
            self.table.apply(deletion);
        }
    }

    /// Deletes the head and the releases of a key nothing waits behind.
    pub async fn close(&self, lane: &Lane, head: Option<String>, releases: Vec<String>) {
        let mut deletions = Vec::new();
        if head.is_some() {
            deletions.push(Record::Head {
                lane: lane.clone(),
                head: None,
            });
        }
        for head in releases {
            deletions.push(Record::Release {
                lane: lane.clone(),
                head,
                release: None,
            });
        }
        for deletion in deletions {
            if self.write(deletion.clone()).await.is_err() {
                // Logged: it is forgotten here, and read again at a restart.
                self.table.apply(deletion);
            }
        }
    }

    /// Records that the head `head` of `lane` no longer holds it. Given up
    /// at the stop, the head is left holding the key: it is read again from
    /// its tier after a restart, and resolves again.
    pub async fn resolved(
        &self,
        lane: &Lane,
        head: &str,
        cause: ReleaseCause,
    ) -> Result<(), Stopping> {
        if !self.table.releases(lane, head, cause) {
            return Ok(());
        }
        // The release follows the head's record, written by the other
        // producer ([`Store::head`]), to the topic.
        self.acked_tag(self.tag(lane, HEAD)).await?;
        let release = Record::Release {
            lane: lane.clone(),
            head: head.to_string(),
            release: Some(ParkTable::release_now(cause)),
        };
        match self.write(release.clone()).await {
            Ok(()) => {}
            Err(Unwritten::Stopping(stopping)) => return Err(stopping),
            // Logged: released here; at a restart its head is read again
            // from its tier, or released by an operator.
            Err(Unwritten::Refused(_)) => self.table.apply(release),
        }
        self.telemetry.emit(events::KeyReleased {
            route: self.table.route.clone(),
            lane: lane.clone(),
            head: head.to_string(),
            cause,
            blocks: cause == ReleaseCause::DeadLettered
                && self.table.policy() == crate::config::KeyDeadLetter::DeadLetterKey,
        });
        Ok(())
    }

    /// An operator's release of `lane`: returns the head it was parked or
    /// blocked behind.
    pub async fn release(&self, lane: &Lane) -> Result<String, ParkError> {
        let (head, _) = self
            .table
            .head_of(lane)
            .ok_or_else(|| ParkError::NotParked {
                lane: lane.to_string(),
            })?;
        self.resolved(lane, &head, ReleaseCause::Operator)
            .await
            .map_err(|_| ParkError::Stopping)?;
        Ok(head)
    }

    /// Produces `hop` and waits for its acknowledgement, trying again as
    /// [`Store::write`] does; then reports it, as a pipeline's producer
    /// does on an acknowledgement. A hop the broker refuses for good is
    /// dead-lettered in its place, as the pipeline's producer does
    /// ([`crate::produce::instead_of_refused`]), and says so
    /// ([`Sent::DeadLettered`]); a dead letter refused for good halts the
    /// route's pipeline. Either, and hopper's stop, give the hop up: what
    /// needed it is left undone.
    pub async fn send(&self, hop: PlannedHop) -> Result<Sent, Stopping> {
        let PlannedHop {
            mut record,
            mut outcome,
        } = hop;
        let mut became = Sent::Written;
        let mut failures = 0u32;
        loop {
            let mut out = FutureRecord::<[u8], [u8]>::to(&record.topic)
                .headers(record.headers.clone())
                .timestamp(record.timestamp);
            if let Some(key) = &record.key {
                out = out.key(key);
            }
            if let Some(payload) = &record.payload {
                out = out.payload(payload);
            }
            let sent = tokio::select! {
                sent = self.producer.send(out, SEND_TIMEOUT) => sent,
                () = self.stopping.cancelled() => return Err(Stopping),
            };
            let Err(e) = sent else { break };
            failures += 1;
            let Some(reason) = crate::produce::refused_for_good(e.rdkafka_error_code(), failures)
            else {
                tracing::warn!(
                    route = self.table.route,
                    topic = record.topic,
                    error = %e,
                    failures,
                    "A parked message's hop failed; trying again."
                );
                self.back_off(failures).await?;
                continue;
            };
            let error = format!("producing to `{}` failed: {e}", record.topic);
            let topic = record.topic.clone();
            match crate::produce::instead_of_refused(
                &self.table.route,
                &self.dlq,
                record,
                reason,
                &error,
            ) {
                Ok(dead) => {
                    self.telemetry.emit(events::HopFailed {
                        route: self.table.route.clone(),
                        topic,
                        error,
                        outcome: crate::types::HopFailure::DeadLettered,
                    });
                    (record, outcome, failures) = (dead.record, dead.outcome, 0);
                    became = Sent::DeadLettered;
                }
                Err(_) => {
                    self.telemetry.emit(events::HopFailed {
                        route: self.table.route.clone(),
                        topic,
                        error: error.clone(),
                        outcome: crate::types::HopFailure::Halted,
                    });
                    self.halt.fail(format!(
                        "a dead-letter record of `{}` was refused for good: {error}",
                        self.table.route
                    ));
                    return Err(Stopping);
                }
            }
        }
        self.telemetry.emit(outcome);
        Ok(became)
    }
}
