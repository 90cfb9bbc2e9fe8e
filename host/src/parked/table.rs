//! The parked keys of one route, as its park topic has them: what a
//! message of a key may do now, and what a partition's task has to do for
//! the keys whose head resolved.

use super::records::{Head, Lane, Parked, Record, Release};
use crate::clock::now_ms;
use crate::config::KeyDeadLetter;
use crate::health::ParkedSummary;
use crate::types::{ReleaseCause, TopicPartition};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// How long a key's records are kept after its head's release when nothing
/// waits behind it. Its head's tier record is committed well within it, so
/// a head read again from its tier after a crash is recognised as resolved
/// ([`ParkTable::settled`]) rather than called after the key's later
/// messages.
pub const CLOSE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
const CLOSE_AFTER_MS: i64 = CLOSE_AFTER.as_millis() as i64;
/// What a parked key costs in memory besides its waiting messages (its
/// entry and its head), counted against the bound.
pub const KEY_BYTES: usize = 512;
/// How far ahead of this process's clock a record read from the park topic
/// may date itself (a head's `since`, a release's `at`): clocks differ, but
/// not by more.
pub const MAX_SKEW_MS: i64 = 5 * 60 * 1000;
/// The highest input offset a record read while following the topic may
/// name (2^53): at a million messages a second, a partition reaches it in
/// 285 years. A record read at start must name an offset below its
/// partition's end, read just before.
pub const MAX_OFFSET: i64 = 1 << 53;

pub use crate::types::ParkRefusal as Refusal;

/// What a key is, as the table has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyState {
    /// Its head waits in a retry tier; its messages wait behind it.
    Parked,
    /// Its head was dead-lettered on a route with `on_key_dead_letter =
    /// "dead-letter-key"`: its messages are dead-lettered until an
    /// operator releases it.
    Blocked,
    /// Its head resolved (or was released): its waiting messages are being
    /// handled, in order, and then its records deleted.
    Releasing,
}

/// One key of [`ParkTable::list`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyView {
    #[serde(flatten)]
    pub lane: LaneView,
    pub state: KeyState,
    /// The head's id, when it has one.
    pub head: Option<String>,
    /// When the head parked the key, epoch ms.
    pub since_ms: Option<i64>,
    /// Messages waiting.
    pub parked: usize,
    /// Their bytes in memory.
    pub bytes: usize,
}

/// A lane as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LaneView {
    pub topic: String,
    pub partition: i32,
    /// The key as UTF-8 (lossy).
    pub key: String,
    pub key_base64: String,
}

impl From<&Lane> for LaneView {
    fn from(lane: &Lane) -> LaneView {
        use base64::Engine as _;
        LaneView {
            topic: lane.topic.clone(),
            partition: lane.partition,
            key: String::from_utf8_lossy(&lane.key).into_owned(),
            key_base64: base64::engine::general_purpose::STANDARD.encode(&lane.key),
        }
    }
}

/// What a message read from the input may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Its key is free: call the handler.
    Call,
    /// It is its key's head, read again (a restart before its offset was
    /// committed): call the handler; the key stays parked on a retry.
    CallAsHead,
    /// It is older than its key's head, read again after a restart: it was
    /// handled before the key parked. Call the handler again (at least
    /// once), without touching the key.
    Redeliver,
    /// It was parked already (read again after a restart): nothing to do.
    Skip,
    /// Its key is parked: it waits.
    Park,
    /// Its key is blocked behind the dead-lettered `head`.
    Block { head: String },
}

/// What a key's job does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the key is parked (or gone).
    Nothing,
    /// Handle the waiting message `seq`.
    Handle { seq: i64, message: Parked },
    /// Dead-letter the waiting message `seq` of a key blocked behind
    /// `head`.
    DeadLetter {
        seq: i64,
        message: Parked,
        head: String,
    },
    /// Nothing waits: delete the key's head and releases.
    Close {
        head: Option<String>,
        releases: Vec<String>,
    },
}

#[derive(Debug, Default)]
struct LaneState {
    head: Option<Head>,
    releases: HashMap<String, Release>,
    parked: BTreeMap<i64, Parked>,
    bytes: usize,
    /// A job of this key waits in its partition's queue, or runs.
    queued: bool,
    /// Under `on_key_dead_letter = "dead-letter-key"`: a message of the key
    /// went past its share, so every later one is dead-lettered too, until
    /// the key is free again or an operator releases it.
    overflowed: bool,
    /// The highest input offset of a waiting message of the key handed on.
    /// Not one still waiting, nor a head's: a record written with a
    /// made-up offset would pass for every message of the key below it.
    high: Option<i64>,
}

impl LaneState {
    fn state(&self, policy: KeyDeadLetter) -> Option<KeyState> {
        match &self.head {
            Some(head) => Some(match self.releases.get(&head.head) {
                // The head still waits here: a job was handing it on to a
                // retry tier, and its retry record may never have been
                // written (a crash). It is handed on again.
                None if self.parked.contains_key(&head.seq) => KeyState::Releasing,
                None => KeyState::Parked,
                Some(r)
                    if r.cause == ReleaseCause::DeadLettered
                        && policy == KeyDeadLetter::DeadLetterKey =>
                {
                    KeyState::Blocked
                }
                Some(_) => KeyState::Releasing,
            }),
            // Its head deleted, and its releases not yet: nothing holds it.
            // Messages read at start before their key's head (compaction
            // keeps a rewritten head's latest record only) wait for it, and
            // are dropped if none comes ([`ParkTable::loaded`]).
            None if !self.releases.is_empty() => Some(KeyState::Releasing),
            None => None,
        }
    }

    /// Its state as the listing and the gauges show it: none for a key
    /// whose messages were all handed on, kept only until [`CLOSE_AFTER`].
    fn shown(&self, policy: KeyDeadLetter) -> Option<KeyState> {
        match self.state(policy)? {
            KeyState::Releasing if self.parked.is_empty() => None,
            state => Some(state),
        }
    }

    /// Whether a job of the key has something to do at `now` (epoch ms):
    /// a waiting message to hand on, or, once [`CLOSE_AFTER`] has passed
    /// since its last release, the key's records to delete.
    fn has_work(&self, policy: KeyDeadLetter, now: i64) -> bool {
        match self.state(policy) {
            Some(KeyState::Releasing) => {
                (self.head.is_some() && !self.parked.is_empty())
                    || (self.parked.is_empty() && self.lingered(now))
            }
            Some(KeyState::Blocked) => !self.parked.is_empty(),
            _ => false,
        }
    }

    /// The waiting message a job may hand on next: none without a head.
    fn first(&self) -> Option<(&i64, &Parked)> {
        self.head.as_ref()?;
        self.parked.iter().next()
    }

    /// Whether every release of the key is older than [`CLOSE_AFTER`].
    fn lingered(&self, now: i64) -> bool {
        let newest = self
            .releases
            .values()
            .map(|r| r.at)
            .max()
            .unwrap_or(i64::MIN);
        newest.saturating_add(CLOSE_AFTER_MS) <= now
    }

    fn took(&mut self, seq: i64) {
        self.high = Some(self.high.map_or(seq, |h| h.max(seq)));
    }
}

#[derive(Default)]
struct Inner {
    lanes: HashMap<Lane, LaneState>,
    bytes: usize,
    messages: usize,
    /// The partitions this process's tasks run, and how to wake each.
    watchers: HashMap<TopicPartition, Arc<Notify>>,
    /// Keys with work, per partition, not yet handed out as jobs.
    work: HashMap<TopicPartition, Vec<Lane>>,
}

/// The route's input partitions, which are the only lanes a park topic
/// may hold: per input topic, each partition's end (high watermark) when
/// the table was loaded.
pub type Inputs = HashMap<String, Vec<i64>>;

/// The slots of [`Occupancy`]: 128 KiB a route. With 1,000 keys in the
/// table, 1.5% of free keys share a slot with one and take the lock.
const SLOTS: usize = 1 << 15;

/// Which keys may have an entry in the table, read without its lock: per
/// slot of a hash of (input partition, key), how many entries hash there.
/// A slot at zero means no key of that slot has an entry: its message is
/// called straight away, with no lock, no lane and no id (a route that
/// never parks pays nothing else for the option). Two keys sharing a slot
/// only cost the second a look under the lock.
///
/// A slot is raised before its entry is added and lowered after it is
/// removed, both under the table's lock, so a slot at zero never hides an
/// entry. The entries of a partition's keys are only added in their key's
/// turn in that partition's task, or by the topic's reader, which the task
/// waits for when the partition is assigned ([`ParkTable::watch`]).
struct Occupancy {
    /// Seeded per table: keys crafted to share a slot share it by chance
    /// only.
    hasher: foldhash::quality::RandomState,
    slots: Box<[AtomicU32]>,
}

impl Occupancy {
    fn new() -> Occupancy {
        Occupancy {
            hasher: foldhash::quality::RandomState::default(),
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn slot(&self, partition: i32, key: &[u8]) -> &AtomicU32 {
        let hash = self.hasher.hash_one((partition, key));
        &self.slots[hash as usize & (SLOTS - 1)]
    }

    fn added(&self, lane: &Lane) {
        self.slot(lane.partition, &lane.key)
            .fetch_add(1, Ordering::Release);
    }

    fn removed(&self, lane: &Lane) {
        self.slot(lane.partition, &lane.key)
            .fetch_sub(1, Ordering::Release);
    }

    fn empty(&self, partition: i32, key: &[u8]) -> bool {
        self.slot(partition, key).load(Ordering::Acquire) == 0
    }
}

/// The parked keys of one route, in every process of the route.
pub struct ParkTable {
    pub(super) route: String,
    pub(super) topic: String,
    policy: KeyDeadLetter,
    max_bytes: usize,
    /// The most bytes of waiting messages one key may hold.
    max_key_bytes: usize,
    /// The most bytes records read from the topic may take: past it, a
    /// record is refused ([`Refusal::OverCeiling`]).
    ceiling: usize,
    inputs: Inputs,
    /// Reading the topic to its end, at start ([`ParkTable::loaded`]).
    loading: std::sync::atomic::AtomicBool,
    inner: Mutex<Inner>,
    /// Woken when parked bytes are freed.
    room: Notify,
    /// The bytes of parked messages held, as in `inner`, read without its
    /// lock on every turn of a partition's task.
    held: std::sync::atomic::AtomicUsize,
    /// Which keys may have an entry in `inner.lanes`, read without its lock
    /// on every message.
    occupied: Occupancy,
}

impl ParkTable {
    pub fn new(
        route: &str,
        topic: &str,
        policy: KeyDeadLetter,
        (max_bytes, max_key_bytes): (usize, usize),
        inputs: Inputs,
    ) -> ParkTable {
        ParkTable {
            route: route.to_string(),
            topic: topic.to_string(),
            policy,
            max_bytes,
            max_key_bytes,
            ceiling: max_bytes.saturating_mul(2),
            inputs,
            loading: std::sync::atomic::AtomicBool::new(true),
            inner: Mutex::default(),
            room: Notify::new(),
            held: std::sync::atomic::AtomicUsize::new(0),
            occupied: Occupancy::new(),
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn route(&self) -> &str {
        &self.route
    }

    pub fn policy(&self) -> KeyDeadLetter {
        self.policy
    }

    /// Applies one record this process wrote.
    pub fn apply(&self, record: Record) {
        let inner = self.inner.lock().unwrap();
        self.apply_locked(inner, record);
    }

    /// Takes in one record read from the park topic, written by another
    /// process or by anyone else who may write the topic: only what this
    /// route could have written is believed. A record refused changes
    /// nothing.
    pub fn read(&self, record: Record) -> Result<(), Refusal> {
        let now = now_ms();
        let lane = record.lane();
        let end = self
            .inputs
            .get(&lane.topic)
            .and_then(|ends| ends.get(usize::try_from(lane.partition).ok()?))
            .ok_or(Refusal::UnknownLane)?;
        let loading = self.loading.load(std::sync::atomic::Ordering::Relaxed);
        // What names an offset past its partition's end is dropped once
        // the topic is read ([`ParkTable::loaded`]).
        let limit = MAX_OFFSET.max(*end);
        let offset_ok = |seq: i64| (0..=limit).contains(&seq);
        let time_ok = |ms: i64| (0..=now.saturating_add(MAX_SKEW_MS)).contains(&ms);
        let inner = self.inner.lock().unwrap();
        let state = inner.lanes.get(lane);
        let new_lane = if state.is_none() { KEY_BYTES } else { 0 };
        let room = |more: usize| inner.bytes + more <= self.ceiling;
        match &record {
            Record::Head { head: Some(h), .. } => {
                if !offset_ok(h.seq) {
                    return Err(Refusal::BadOffset);
                }
                if !time_ok(h.since) {
                    return Err(Refusal::BadTime);
                }
                if !room(new_lane) {
                    return Err(Refusal::OverCeiling);
                }
            }
            Record::Head { head: None, .. } => {
                // A key's head is deleted only once nothing waits behind it.
                if state.is_some_and(|s| !s.parked.is_empty()) {
                    return Err(Refusal::NoHead);
                }
            }
            Record::Parked {
                seq,
                message: Some(message),
                ..
            } => {
                if !offset_ok(*seq) {
                    return Err(Refusal::BadOffset);
                }
                // At start, a key's rewritten head may come after its
                // waiting messages; from then on it is always written first.
                if !loading && state.is_none_or(|s| s.head.is_none()) {
                    return Err(Refusal::NoHead);
                }
                if !room(new_lane + message.size()) {
                    return Err(Refusal::OverCeiling);
                }
            }
            Record::Release {
                release: Some(release),
                ..
            } => {
                if !time_ok(release.at) {
                    return Err(Refusal::BadTime);
                }
                if !room(new_lane) {
                    return Err(Refusal::OverCeiling);
                }
            }
            Record::Parked { message: None, .. } | Record::Release { release: None, .. } => {
                if state.is_none() {
                    // Deletes nothing.
                    return Ok(());
                }
            }
        }
        self.apply_locked(inner, record);
        Ok(())
    }

    /// The topic was read to its end, and `ends` are its input
    /// partitions' ends read after that: every record read was written for
    /// a message read before, below them. Drops the heads and waiting
    /// messages that name an offset at or past their partition's end
    /// ([`Refusal::BadOffset`]), then the waiting messages whose key has
    /// no head, none having been written for them ([`Refusal::NoHead`]).
    /// From now on a waiting message comes after its key's head. Returns
    /// how many it dropped, for each reason.
    pub fn loaded(&self, ends: &Inputs) -> [(Refusal, usize); 2] {
        self.loading
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut inner = self.inner.lock().unwrap();
        let Inner {
            lanes,
            bytes,
            messages,
            ..
        } = &mut *inner;
        let (mut past, mut headless) = (0, 0);
        lanes.retain(|lane, state| {
            let end = ends
                .get(&lane.topic)
                .and_then(|e| e.get(usize::try_from(lane.partition).ok()?))
                .copied()
                .unwrap_or(0);
            if state.head.as_ref().is_some_and(|h| h.seq >= end) {
                past += 1;
                state.head = None;
            }
            let beyond: Vec<i64> = state.parked.range(end..).map(|(seq, _)| *seq).collect();
            for seq in beyond {
                let message = state.parked.remove(&seq).expect("listed");
                past += 1;
                *messages -= 1;
                *bytes -= message.size();
                state.bytes -= message.size();
            }
            if state.head.is_none() {
                headless += state.parked.len();
                *messages -= state.parked.len();
                *bytes -= state.bytes;
                state.parked.clear();
                state.bytes = 0;
            }
            if state.state(self.policy).is_none() {
                *bytes -= KEY_BYTES;
                self.occupied.removed(lane);
                return false;
            }
            true
        });
        self.held
            .store(*bytes, std::sync::atomic::Ordering::Relaxed);
        drop(inner);
        self.room.notify_waiters();
        [(Refusal::BadOffset, past), (Refusal::NoHead, headless)]
    }

    fn apply_locked(&self, mut inner: std::sync::MutexGuard<'_, Inner>, record: Record) {
        let lane = record.lane().clone();
        let Inner {
            lanes,
            bytes,
            messages,
            ..
        } = &mut *inner;
        let state = lanes.entry(lane.clone()).or_insert_with(|| {
            *bytes += KEY_BYTES;
            self.occupied.added(&lane);
            LaneState::default()
        });
        let mut freed = false;
        match record {
            Record::Head { head, .. } => state.head = head,
            Record::Parked { seq, message, .. } => {
                if let Some(old) = state.parked.remove(&seq) {
                    state.bytes -= old.size();
                    *bytes -= old.size();
                    *messages -= 1;
                    freed = true;
                    if message.is_none() {
                        state.took(seq);
                    }
                }
                if let Some(message) = message {
                    state.bytes += message.size();
                    *bytes += message.size();
                    *messages += 1;
                    state.parked.insert(seq, message);
                }
            }
            Record::Release { head, release, .. } => match release {
                Some(release) => {
                    if release.cause == ReleaseCause::Operator {
                        state.overflowed = false;
                    }
                    state.releases.insert(head, release);
                }
                None => _ = state.releases.remove(&head),
            },
        }
        let has_work = state.has_work(self.policy, now_ms()) && !state.queued;
        if state.state(self.policy).is_none() && state.parked.is_empty() && !state.queued {
            lanes.remove(&lane);
            self.occupied.removed(&lane);
            *bytes -= KEY_BYTES;
            freed = true;
        }
        self.held
            .store(*bytes, std::sync::atomic::Ordering::Relaxed);
        if has_work {
            wake(&mut inner, &lane);
        }
        drop(inner);
        if freed {
            self.room.notify_waiters();
        }
    }

    /// `max_parked_key_mib`, in bytes.
    pub fn key_share(&self) -> usize {
        self.max_key_bytes
    }

    /// Whether a message of `size` bytes would take `lane` past its share
    /// of the parked messages; under `on_key_dead_letter =
    /// "dead-letter-key"`, also whether one of the key's messages went
    /// past it before (and the key was not free or released since).
    pub fn over_share(&self, lane: &Lane, size: usize) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get_mut(lane) else {
            return false;
        };
        if state.overflowed {
            return true;
        }
        let over = state.bytes + size > self.max_key_bytes;
        if over && self.policy == KeyDeadLetter::DeadLetterKey {
            state.overflowed = true;
        }
        over
    }

    /// Takes the waiting message `seq` of `lane` out of the table: the
    /// park topic refused its record.
    pub fn take(&self, lane: &Lane, seq: i64) -> Option<Parked> {
        let message = {
            let inner = self.inner.lock().unwrap();
            inner.lanes.get(lane)?.parked.get(&seq)?.clone()
        };
        self.apply(Record::Parked {
            lane: lane.clone(),
            seq,
            message: None,
        });
        Some(message)
    }

    /// Whether the message `seq` of `lane` still waits in the table: one
    /// whose record the park topic refused for good was taken out
    /// ([`ParkTable::take`]), to be dead-lettered instead.
    pub fn waits(&self, lane: &Lane, seq: i64) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .lanes
            .get(lane)
            .is_some_and(|state| state.parked.contains_key(&seq))
    }

    /// Whether the key `key` of input partition `partition` is surely
    /// free: the table has no entry for it, so its message is called
    /// ([`Admission::Call`]). It takes no lock and builds nothing; `false`
    /// (the key has an entry, or shares its slot with one) means: ask
    /// [`ParkTable::admit`].
    pub fn is_free(&self, partition: i32, key: &[u8]) -> bool {
        self.occupied.empty(partition, key)
    }

    /// What a message of `lane` read from the input at `seq`, with id `id`,
    /// may do.
    pub fn admit(&self, lane: &Lane, seq: i64, id: &str) -> Admission {
        let inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get(lane) else {
            return Admission::Call;
        };
        let key_state = state.state(self.policy);
        match (&state.head, key_state) {
            (_, None) => Admission::Call,
            (Some(head), Some(KeyState::Parked)) if head.head == id && head.seq == seq => {
                Admission::CallAsHead
            }
            (Some(head), _) if seq < head.seq => Admission::Redeliver,
            // The head itself, read again once resolved or being handed on.
            (Some(head), _) if seq == head.seq && head.head == id => Admission::Skip,
            _ if state.parked.contains_key(&seq) || state.high.is_some_and(|high| seq <= high) => {
                Admission::Skip
            }
            // No head holds it: only its releases are left, to be deleted.
            (None, _) => Admission::Call,
            (Some(head), Some(KeyState::Blocked)) => Admission::Block {
                head: head.head.clone(),
            },
            _ => Admission::Park,
        }
    }

    /// Whether `lane`'s head is the message `id` read at input offset
    /// `seq`. A head is known by its lane, its id and its offset: an id
    /// alone is the producer's to choose, and a message of another key, or
    /// of another partition, may carry it.
    pub fn is_head(&self, lane: &Lane, id: &str, seq: i64) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .lanes
            .get(lane)
            .and_then(|state| state.head.as_ref())
            .is_some_and(|head| head.head == id && head.seq == seq)
    }

    /// Whether the message `id` (input offset `seq`) read from a retry
    /// tier holds `lane`: it is the head the key is parked or blocked
    /// behind. `None` when the table has no head for the key (its record
    /// may not have been read yet).
    pub fn holds(&self, lane: &Lane, id: &str, seq: i64) -> Option<bool> {
        let inner = self.inner.lock().unwrap();
        let state = inner.lanes.get(lane)?;
        let head = state.head.as_ref()?;
        Some(
            head.head == id
                && head.seq == seq
                && matches!(
                    state.state(self.policy),
                    Some(KeyState::Parked | KeyState::Blocked)
                ),
        )
    }

    /// Whether a release of `head` by `cause` would change anything: the
    /// key is parked behind it (or the table does not know the head, whose
    /// record may not have been read yet).
    pub fn releases(&self, lane: &Lane, head: &str, cause: ReleaseCause) -> bool {
        let inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get(lane) else {
            return true;
        };
        match &state.head {
            Some(h) if h.head == head => state.releases.get(head).is_none_or(|r| r.cause != cause),
            Some(_) => false,
            None => true,
        }
    }

    /// The head a key is parked or blocked behind, for an operator's
    /// release; `None` when the key is neither.
    pub fn head_of(&self, lane: &Lane) -> Option<(String, KeyState)> {
        let inner = self.inner.lock().unwrap();
        let state = inner.lanes.get(lane)?;
        match state.state(self.policy)? {
            KeyState::Releasing => None,
            key_state => Some((state.head.as_ref()?.head.clone(), key_state)),
        }
    }

    /// Whether the table holds as many parked bytes as its bound: the
    /// route's partitions read nothing more until it has room again.
    pub fn full(&self) -> bool {
        self.held.load(std::sync::atomic::Ordering::Relaxed) >= self.max_bytes
    }

    /// Waits until the table holds fewer parked bytes than its bound.
    pub async fn room(&self) {
        loop {
            let freed = self.room.notified();
            if !self.full() {
                return;
            }
            freed.await;
        }
    }

    /// Registers the task of `tp`, which `wake` wakes when one of its keys
    /// has work; the keys that have some now are queued for it at once.
    pub fn watch(&self, tp: &TopicPartition, wake: Arc<Notify>) {
        let now = now_ms();
        let mut inner = self.inner.lock().unwrap();
        inner.watchers.insert(tp.clone(), wake.clone());
        let with_work: Vec<Lane> = inner
            .lanes
            .iter_mut()
            .filter(|(lane, _)| lane.topic == tp.topic && lane.partition == tp.partition)
            .filter_map(|(lane, state)| {
                // A job queued by a task of an earlier ownership is gone.
                state.queued = false;
                state.has_work(self.policy, now).then(|| lane.clone())
            })
            .collect();
        inner.work.insert(tp.clone(), with_work);
        wake.notify_one();
    }

    /// The task of `tp` ended.
    pub fn unwatch(&self, tp: &TopicPartition) {
        let mut inner = self.inner.lock().unwrap();
        inner.watchers.remove(tp);
        inner.work.remove(tp);
    }

    /// The keys of `tp` with work, each handed out once until its job ends
    /// ([`ParkTable::job_done`]).
    pub fn jobs(&self, tp: &TopicPartition) -> Vec<Lane> {
        let mut inner = self.inner.lock().unwrap();
        let Some(work) = inner.work.get_mut(tp) else {
            return Vec::new();
        };
        let mut lanes = std::mem::take(work);
        let now = now_ms();
        lanes.retain(|lane| match inner.lanes.get_mut(lane) {
            Some(state) if !state.queued && state.has_work(self.policy, now) => {
                state.queued = true;
                true
            }
            _ => false,
        });
        lanes
    }

    /// What the job of `lane` does next.
    pub fn step(&self, lane: &Lane) -> Step {
        let inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get(lane) else {
            return Step::Nothing;
        };
        let first = state.first();
        match (state.state(self.policy), first) {
            (Some(KeyState::Blocked), Some((seq, message))) => Step::DeadLetter {
                seq: *seq,
                message: message.clone(),
                head: state
                    .head
                    .as_ref()
                    .map(|h| h.head.clone())
                    .unwrap_or_default(),
            },
            (Some(KeyState::Releasing), Some((seq, message))) => Step::Handle {
                seq: *seq,
                message: message.clone(),
            },
            (Some(KeyState::Releasing), None)
                if state.parked.is_empty() && state.lingered(now_ms()) =>
            {
                Step::Close {
                    head: state.head.as_ref().map(|h| h.head.clone()),
                    releases: state.releases.keys().cloned().collect(),
                }
            }
            _ => Step::Nothing,
        }
    }

    /// The job of `lane` ended: the key may be handed out again, now if it
    /// has more work.
    pub fn job_done(&self, lane: &Lane) {
        let mut inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get_mut(lane) else {
            return;
        };
        state.queued = false;
        if state.state(self.policy).is_none() && state.parked.is_empty() {
            inner.lanes.remove(lane);
            self.occupied.removed(lane);
            inner.bytes -= KEY_BYTES;
            self.held
                .store(inner.bytes, std::sync::atomic::Ordering::Relaxed);
            drop(inner);
            self.room.notify_waiters();
        } else if state.has_work(self.policy, now_ms()) {
            wake(&mut inner, lane);
        }
    }

    /// Queues, for the partitions this process runs, the keys whose records
    /// may be deleted now that [`CLOSE_AFTER`] has passed since their
    /// release. Called every second.
    pub fn sweep(&self) {
        let now = now_ms();
        let mut inner = self.inner.lock().unwrap();
        let due: Vec<Lane> = inner
            .lanes
            .iter()
            .filter(|(lane, state)| {
                !state.queued
                    && state.parked.is_empty()
                    && state.has_work(self.policy, now)
                    && inner
                        .watchers
                        .contains_key(&TopicPartition::new(&lane.topic, lane.partition))
            })
            .map(|(lane, _)| lane.clone())
            .collect();
        for lane in due {
            wake(&mut inner, &lane);
        }
    }

    /// Whether a head read from its tier (`id`, input offset `seq`) was
    /// resolved already: its release is in the table, or its key has moved
    /// on past it. Its hops were acknowledged before its release was
    /// written, so calling it again would only repeat it after the key's
    /// later messages.
    pub fn settled(&self, lane: &Lane, id: &str, seq: i64) -> bool {
        let inner = self.inner.lock().unwrap();
        let Some(state) = inner.lanes.get(lane) else {
            return false;
        };
        match &state.head {
            Some(head) if head.head == id && head.seq == seq => state.releases.contains_key(id),
            Some(head) => head.seq > seq,
            None => state.high.is_some_and(|high| high >= seq),
        }
    }

    /// Every parked, blocked or releasing key, oldest first; not a key
    /// whose messages were all handed on, kept until [`CLOSE_AFTER`] has
    /// passed.
    pub fn list(&self) -> Vec<KeyView> {
        let inner = self.inner.lock().unwrap();
        let mut keys: Vec<KeyView> = inner
            .lanes
            .iter()
            .filter_map(|(lane, state)| {
                Some(KeyView {
                    lane: LaneView::from(lane),
                    state: state.shown(self.policy)?,
                    head: state.head.as_ref().map(|h| h.head.clone()),
                    since_ms: state.head.as_ref().map(|h| h.since),
                    parked: state.parked.len(),
                    bytes: state.bytes,
                })
            })
            .collect();
        keys.sort_by_key(|k| (k.since_ms.unwrap_or(i64::MAX), k.lane.partition));
        keys
    }

    /// The table's figures.
    pub fn summary(&self) -> ParkedSummary {
        let inner = self.inner.lock().unwrap();
        let mut summary = ParkedSummary {
            messages: inner.messages,
            bytes: inner.bytes,
            ..ParkedSummary::default()
        };
        for state in inner.lanes.values() {
            match state.shown(self.policy) {
                Some(KeyState::Blocked) => summary.blocked_keys += 1,
                Some(_) => summary.parked_keys += 1,
                None => continue,
            }
            if let Some(head) = &state.head {
                summary.oldest_since = Some(
                    summary
                        .oldest_since
                        .map_or(head.since, |o| o.min(head.since)),
                );
            }
        }
        summary
    }

    /// The lane of a head that resolved now, with the release to write.
    pub fn release_now(cause: ReleaseCause) -> Release {
        Release {
            cause,
            at: now_ms(),
        }
    }
}

/// Queues `lane` for its partition's task and wakes it, when this process
/// runs that partition.
fn wake(inner: &mut Inner, lane: &Lane) {
    let tp = TopicPartition::new(&lane.topic, lane.partition);
    let Some(watcher) = inner.watchers.get(&tp).cloned() else {
        return;
    };
    inner.work.entry(tp).or_default().push(lane.clone());
    watcher.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(key: &str) -> Lane {
        Lane {
            topic: "orders".into(),
            partition: 0,
            key: key.as_bytes().to_vec(),
        }
    }

    fn head(lane: &Lane, id: &str, seq: i64) -> Record {
        Record::Head {
            lane: lane.clone(),
            head: Some(Head {
                head: id.into(),
                seq,
                since: 1,
            }),
        }
    }

    fn parked(lane: &Lane, seq: i64) -> Record {
        Record::Parked {
            lane: lane.clone(),
            seq,
            message: Some(Parked {
                payload: Some(vec![b'x'; 10]),
                headers: vec![],
                timestamp: None,
            }),
        }
    }

    fn release(lane: &Lane, id: &str, cause: ReleaseCause) -> Record {
        Record::Release {
            lane: lane.clone(),
            head: id.into(),
            release: Some(Release { cause, at: 2 }),
        }
    }

    /// The route's one input, `orders`, of two partitions, each 1000
    /// records long.
    fn inputs() -> Inputs {
        HashMap::from([("orders".to_string(), vec![1_000, 1_000])])
    }

    fn table(policy: KeyDeadLetter) -> ParkTable {
        ParkTable::new(
            "orders",
            "orders.parked",
            policy,
            (1 << 20, 1 << 20),
            inputs(),
        )
    }

    /// A job hands a waiting message on to a retry tier: its head record
    /// is written while the message still waits, and its waiting record is
    /// deleted only once the retry is written. Until the job takes it out
    /// of the table, the key reads as releasing, and its retry, read from
    /// the tier, would not resolve it: the key would stay parked for ever.
    #[test]
    fn a_message_handed_on_and_retried_holds_its_key_once_taken_from_the_table() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("acct-1");
        t.apply(head(&k, "m5", 5));
        t.apply(parked(&k, 7));
        t.apply(release(&k, "m5", ReleaseCause::Resolved));
        assert!(matches!(t.step(&k), Step::Handle { seq: 7, .. }));
        t.apply(head(&k, "m7", 7));
        assert_eq!(
            t.holds(&k, "m7", 7),
            Some(false),
            "releasing while its copy waits"
        );
        assert!(t.take(&k, 7).is_some());
        assert_eq!(t.holds(&k, "m7", 7), Some(true));
        assert_eq!(t.head_of(&k), Some(("m7".into(), KeyState::Parked)));
        assert_eq!(
            t.admit(&k, 7, "m7"),
            Admission::CallAsHead,
            "read again, as any head"
        );
        // Its record's deletion, once written, changes nothing more.
        t.apply(Record::Parked {
            lane: k.clone(),
            seq: 7,
            message: None,
        });
        assert_eq!(t.holds(&k, "m7", 7), Some(true));
        assert_eq!(t.summary().messages, 0);
    }

    #[test]
    fn a_key_parks_behind_its_head_and_its_messages_wait_in_order() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("acct-1");
        let tp = TopicPartition::new("orders", 0);
        let wake = Arc::new(Notify::new());
        t.watch(&tp, wake.clone());
        assert_eq!(t.admit(&k, 5, "m5"), Admission::Call);
        t.apply(head(&k, "m5", 5));
        assert_eq!(
            t.admit(&k, 5, "m5"),
            Admission::CallAsHead,
            "the head read again"
        );
        assert_eq!(
            t.admit(&k, 4, "m4"),
            Admission::Redeliver,
            "before the head"
        );
        assert_eq!(t.admit(&k, 7, "m7"), Admission::Park);
        t.apply(parked(&k, 7));
        t.apply(parked(&k, 9));
        assert_eq!(t.admit(&k, 7, "m7"), Admission::Skip, "parked already");
        assert_eq!(t.admit(&lane("other"), 8, "m8"), Admission::Call);
        assert!(t.jobs(&tp).is_empty(), "nothing to do while the head waits");
        assert_eq!(t.summary().parked_keys, 1);
        assert_eq!(t.summary().messages, 2);

        t.apply(release(&k, "m5", ReleaseCause::Resolved));
        assert_eq!(t.jobs(&tp), vec![k.clone()]);
        assert!(t.jobs(&tp).is_empty(), "handed out once");
        assert!(matches!(t.step(&k), Step::Handle { seq: 7, .. }));
        t.apply(Record::Parked {
            lane: k.clone(),
            seq: 7,
            message: None,
        });
        t.job_done(&k);
        assert_eq!(t.jobs(&tp), vec![k.clone()], "more waits");
        assert!(matches!(t.step(&k), Step::Handle { seq: 9, .. }));
        t.apply(Record::Parked {
            lane: k.clone(),
            seq: 9,
            message: None,
        });
        assert_eq!(
            t.step(&k),
            Step::Close {
                head: Some("m5".into()),
                releases: vec!["m5".into()]
            }
        );
        t.apply(Record::Head {
            lane: k.clone(),
            head: None,
        });
        t.apply(Record::Release {
            lane: k.clone(),
            head: "m5".into(),
            release: None,
        });
        assert!(!t.is_free(0, &k.key), "its job still runs");
        t.job_done(&k);
        assert_eq!(t.admit(&k, 10, "m10"), Admission::Call, "free again");
        assert!(t.is_free(0, &k.key), "free again, without the lock");
        assert_eq!(t.summary(), ParkedSummary::default());
        assert!(t.list().is_empty());
    }

    #[test]
    fn a_dead_lettered_head_blocks_its_key_only_under_dead_letter_key() {
        for (policy, blocked) in [
            (KeyDeadLetter::Continue, false),
            (KeyDeadLetter::DeadLetterKey, true),
        ] {
            let t = table(policy);
            let k = lane("acct-2");
            t.apply(head(&k, "m1", 1));
            t.apply(parked(&k, 2));
            t.apply(release(&k, "m1", ReleaseCause::DeadLettered));
            if blocked {
                assert!(
                    matches!(t.step(&k), Step::DeadLetter { seq: 2, ref head, .. } if head == "m1")
                );
                assert_eq!(t.admit(&k, 3, "m3"), Admission::Block { head: "m1".into() });
                assert_eq!(t.head_of(&k), Some(("m1".into(), KeyState::Blocked)));
                t.apply(release(&k, "m1", ReleaseCause::Operator));
                assert!(
                    matches!(t.step(&k), Step::Handle { seq: 2, .. }),
                    "released"
                );
            } else {
                assert!(matches!(t.step(&k), Step::Handle { seq: 2, .. }));
                assert_eq!(t.admit(&k, 3, "m3"), Admission::Park);
            }
        }
    }

    /// A job handing a waiting message on to a retry tier writes the key's
    /// head first: a crash before its retry record leaves a head that is
    /// also one of its key's waiting messages, which nothing else would
    /// ever release.
    #[test]
    fn a_head_still_waiting_in_the_table_is_handed_on_again() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("acct-5");
        let tp = TopicPartition::new("orders", 0);
        t.apply(head(&k, "m1", 1));
        t.apply(parked(&k, 22));
        t.apply(parked(&k, 23));
        t.apply(release(&k, "m1", ReleaseCause::Resolved));
        // The job took 22, which went to a retry tier: its head record is
        // written, then the crash, before its retry record and deletion.
        t.apply(head(&k, "m22", 22));
        t.watch(&tp, Arc::new(Notify::new()));
        assert_eq!(t.jobs(&tp), vec![k.clone()], "after the restart");
        assert!(matches!(t.step(&k), Step::Handle { seq: 22, .. }));
        // Handed on this time: its record is deleted, and the key waits.
        t.apply(Record::Parked {
            lane: k.clone(),
            seq: 22,
            message: None,
        });
        t.job_done(&k);
        assert_eq!(t.head_of(&k), Some(("m22".into(), KeyState::Parked)));
        assert!(t.jobs(&tp).is_empty());
    }

    /// A route that parks nothing must not pay for the option: a message
    /// of a key with no entry is admitted with no look under the table's
    /// lock, which a listing, a sweep or the reader may hold.
    #[test]
    fn a_free_key_is_admitted_while_the_lock_is_held() {
        let t = Arc::new(table(KeyDeadLetter::Continue));
        let parked_key = lane("acct-1");
        t.apply(head(&parked_key, "m1", 1));
        assert!(!t.is_free(0, b"acct-1"), "a parked key is never free");
        // Another key shares the parked key's slot once in 32,768 tables.
        let free_key = (0..100)
            .map(|i| format!("other-{i}"))
            .find(|k| t.is_free(0, k.as_bytes()))
            .expect("a key of another slot");
        assert_eq!(
            t.admit(&lane(&free_key), 2, "m2"),
            Admission::Call,
            "free means called"
        );
        let held = t.inner.lock().unwrap();
        let (tell, told) = std::sync::mpsc::channel();
        let asking = t.clone();
        std::thread::spawn(move || {
            let _ = tell.send(asking.is_free(0, free_key.as_bytes()));
        });
        let answer = told.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        assert_eq!(answer, Ok(true), "answered without the lock");
    }

    /// Whatever the table holds, a key it calls free has no entry, so
    /// [`ParkTable::admit`] would call its message too; and once every key
    /// has gone, every key is free again.
    #[test]
    fn a_key_called_free_is_one_admit_calls() {
        use proptest::prelude::*;
        let ops = proptest::collection::vec((0u8..6, 0usize..6, 0i64..4), 1..120);
        proptest!(|(ops in ops)| {
            let t = table(KeyDeadLetter::DeadLetterKey);
            let keys: Vec<Lane> = (0..6).map(|k| lane(&format!("k{k}"))).collect();
            for (op, k, n) in ops {
                let l = &keys[k];
                let record = match op {
                    0 => head(l, &format!("h{n}"), n),
                    1 => Record::Head { lane: l.clone(), head: None },
                    2 => parked(l, 10 + n),
                    3 => Record::Parked { lane: l.clone(), seq: 10 + n, message: None },
                    4 => release(l, &format!("h{n}"), ReleaseCause::DeadLettered),
                    _ => Record::Release { lane: l.clone(), head: format!("h{n}"), release: None },
                };
                t.apply(record);
                for (i, other) in keys.iter().enumerate() {
                    if t.is_free(0, &other.key) {
                        prop_assert!(
                            !t.inner.lock().unwrap().lanes.contains_key(other),
                            "k{} has an entry", i
                        );
                        prop_assert_eq!(t.admit(other, 20, "m20"), Admission::Call);
                    }
                }
            }
            for l in &keys {
                t.apply(Record::Head { lane: l.clone(), head: None });
                for n in 0..4 {
                    t.apply(Record::Parked { lane: l.clone(), seq: 10 + n, message: None });
                    t.apply(Record::Release { lane: l.clone(), head: format!("h{n}"), release: None });
                }
            }
            prop_assert!(t.inner.lock().unwrap().lanes.is_empty());
            for l in &keys {
                prop_assert!(t.is_free(0, &l.key), "{} free again", l);
            }
        });
    }

    #[test]
    fn a_stale_release_changes_nothing() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("acct-3");
        t.apply(head(&k, "m2", 2));
        assert!(
            !t.releases(&k, "m1", ReleaseCause::Resolved),
            "another head"
        );
        assert!(t.releases(&k, "m2", ReleaseCause::Resolved));
        t.apply(release(&k, "m1", ReleaseCause::Resolved));
        assert_eq!(t.head_of(&k), Some(("m2".into(), KeyState::Parked)));
        assert!(t.releases(&lane("unknown"), "x", ReleaseCause::Resolved));
        assert!(t.is_head(&k, "m2", 2));
    }

    #[tokio::test]
    async fn past_its_bound_the_table_waits_for_room() {
        let t = Arc::new(ParkTable::new(
            "orders",
            "orders.parked",
            KeyDeadLetter::Continue,
            (100, 100),
            inputs(),
        ));
        let k = lane("acct-4");
        assert!(!t.full());
        t.room().await;
        t.apply(parked(&k, 1));
        assert!(t.full());
        let waiting = tokio::spawn({
            let t = t.clone();
            async move { t.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "full: it waits");
        t.apply(Record::Parked {
            lane: k,
            seq: 1,
            message: None,
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken when room was freed")
            .unwrap();
    }

    fn head_at(lane: &Lane, id: &str, seq: i64, since: i64) -> Record {
        Record::Head {
            lane: lane.clone(),
            head: Some(Head {
                head: id.into(),
                seq,
                since,
            }),
        }
    }

    fn in_partition(partition: i32, key: &str) -> Lane {
        Lane {
            partition,
            ..lane(key)
        }
    }

    #[test]
    fn a_record_of_a_lane_the_route_does_not_have_is_refused() {
        let t = table(KeyDeadLetter::Continue);
        let made_up = Lane {
            topic: "elsewhere".into(),
            ..lane("k")
        };
        for lane in [made_up, in_partition(2, "k"), in_partition(-1, "k")] {
            assert_eq!(t.read(head(&lane, "m1", 1)), Err(Refusal::UnknownLane));
            assert_eq!(t.read(parked(&lane, 2)), Err(Refusal::UnknownLane));
            assert_eq!(
                t.read(release(&lane, "m1", ReleaseCause::Operator)),
                Err(Refusal::UnknownLane)
            );
        }
        assert_eq!(t.summary(), ParkedSummary::default(), "nothing kept");
        assert!(t.list().is_empty());
        assert_eq!(t.read(head(&in_partition(1, "k"), "m1", 1)), Ok(()));
    }

    #[test]
    fn an_offset_or_a_time_that_cannot_be_is_refused() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("k");
        let now = now_ms();
        let year_10000 = 253_402_300_800_000;
        for (record, refusal) in [
            (head_at(&k, "m", -1, now), Refusal::BadOffset),
            (head_at(&k, "m", i64::MAX, now), Refusal::BadOffset),
            (head_at(&k, "m", 1, -5), Refusal::BadTime),
            (head_at(&k, "m", 1, now + 3_600_000), Refusal::BadTime),
            (head_at(&k, "m", 1, year_10000), Refusal::BadTime),
            (head_at(&k, "m", 1, i64::MAX), Refusal::BadTime),
        ] {
            assert_eq!(t.read(record.clone()), Err(refusal), "{record:?}");
        }
        assert_eq!(
            t.read(head_at(&k, "m", 0, now + 1_000)),
            Ok(()),
            "a clock ahead"
        );
        assert_eq!(t.read(parked(&k, i64::MAX)), Err(Refusal::BadOffset));
        assert_eq!(t.read(parked(&k, -3)), Err(Refusal::BadOffset));
        // Read at start, an offset at or past its partition's end, read
        // once the topic is, cannot be: dropped then.
        t.read(parked(&k, 1_000)).unwrap();
        t.read(parked(&k, 999)).unwrap();
        let beyond = lane("beyond");
        t.read(head_at(&beyond, "b", 5_000, now)).unwrap();
        t.read(parked(&beyond, 5_001)).unwrap();
        assert_eq!(
            t.read(Record::Release {
                lane: k.clone(),
                head: "m".into(),
                release: Some(Release {
                    cause: ReleaseCause::Resolved,
                    at: year_10000
                }),
            }),
            Err(Refusal::BadTime)
        );
        assert_eq!(
            t.loaded(&inputs()),
            [(Refusal::BadOffset, 3), (Refusal::NoHead, 0)]
        );
        assert_eq!(t.admit(&beyond, 5_001, "b1"), Admission::Call, "dropped");
        assert_eq!(t.summary().messages, 1, "999 waits");
        t.apply(Record::Parked {
            lane: k.clone(),
            seq: 999,
            message: None,
        });
        // Once loaded, an offset past the end read at start may be a
        // message read since; not one past 2^53.
        assert_eq!(t.read(parked(&k, 5_000)), Ok(()));
        assert_eq!(t.read(parked(&k, MAX_OFFSET + 1)), Err(Refusal::BadOffset));
        assert_eq!(t.read(parked(&k, i64::MAX)), Err(Refusal::BadOffset));
        assert_eq!(t.summary().messages, 1);
        let view = &t.list()[0];
        assert_eq!((view.since_ms, view.parked), (Some(now + 1_000), 1));
    }

    /// A head at offset 0 and a message waiting at a made-up offset used
    /// to make every later message of the key "parked already": committed,
    /// and never handled.
    #[test]
    fn a_waiting_message_at_a_made_up_offset_does_not_pass_for_the_keys_later_messages() {
        let t = table(KeyDeadLetter::Continue);
        let k = lane("victim");
        t.read(head(&k, "m0", 0)).unwrap();
        t.read(parked(&k, 999)).unwrap();
        t.loaded(&inputs());
        for seq in [1, 500, 998] {
            assert_eq!(t.admit(&k, seq, "real"), Admission::Park, "{seq}");
        }
        assert_eq!(t.admit(&k, 999, "again"), Admission::Skip, "it waits");
        // A head naming another message's offset does not pass for it.
        let v = lane("victim-2");
        t.read(head(&v, "forged", 3)).unwrap();
        assert_eq!(t.admit(&v, 3, "real/3"), Admission::Park);
        assert_eq!(t.admit(&v, 4, "real/4"), Admission::Park);
    }

    #[test]
    fn a_waiting_message_without_a_head_is_refused_but_one_read_before_its_head_at_start_waits_for_it()
     {
        let t = table(KeyDeadLetter::Continue);
        let tp = TopicPartition::new("orders", 0);
        t.watch(&tp, Arc::new(Notify::new()));
        let (orphan, late) = (lane("orphan"), lane("late-head"));
        // Compaction keeps a rewritten head's latest record only, which may
        // come after the key's waiting messages.
        t.read(parked(&orphan, 7)).unwrap();
        t.read(release(&late, "m1", ReleaseCause::Resolved))
            .unwrap();
        t.read(parked(&late, 9)).unwrap();
        assert!(t.jobs(&tp).is_empty(), "no head: nothing handed on");
        assert_eq!(t.step(&late), Step::Nothing);
        t.read(head(&late, "m7", 7)).unwrap();
        assert_eq!(
            t.loaded(&inputs()),
            [(Refusal::BadOffset, 0), (Refusal::NoHead, 1)],
            "the orphan is dropped"
        );
        assert_eq!(t.summary().messages, 1);
        assert_eq!(
            t.admit(&orphan, 7, "m7"),
            Admission::Call,
            "its key is free"
        );
        assert_eq!(t.head_of(&late), Some(("m7".into(), KeyState::Parked)));
        // From now on a waiting message comes after its key's head.
        assert_eq!(t.read(parked(&lane("x"), 3)), Err(Refusal::NoHead));
        // A head is deleted only once nothing waits behind it.
        assert_eq!(
            t.read(Record::Head {
                lane: late.clone(),
                head: None
            }),
            Err(Refusal::NoHead)
        );
        assert_eq!(t.head_of(&late), Some(("m7".into(), KeyState::Parked)));
        assert_eq!(t.summary().messages, 1);
    }

    #[test]
    fn past_its_ceiling_a_record_read_is_refused() {
        let t = ParkTable::new(
            "orders",
            "orders.parked",
            KeyDeadLetter::Continue,
            (4_000, 4_000),
            inputs(),
        );
        let k = lane("k");
        t.read(head(&k, "m0", 0)).unwrap();
        let mut refused = 0;
        for seq in 1..100 {
            if t.read(parked(&k, seq)) == Err(Refusal::OverCeiling) {
                refused += 1;
            }
        }
        assert!(refused > 0);
        assert!(t.summary().bytes <= 8_000, "{:?}", t.summary());
        assert_eq!(
            t.read(head(&lane("another"), "m1", 1)),
            Err(Refusal::OverCeiling)
        );
        // What this process parks itself is bounded at the read, not here.
        t.apply(parked(&k, 500));
        assert!(t.summary().bytes > 8_000);
    }

    /// A head is known by its lane, its id and its offset: another key's
    /// message carrying the same id settles and releases nothing.
    #[test]
    fn a_head_is_known_by_its_lane_its_id_and_its_offset() {
        let t = table(KeyDeadLetter::Continue);
        let (victim, other) = (lane("victim"), in_partition(1, "other"));
        t.apply(head(&victim, "orders-0-5", 5));
        t.apply(parked(&victim, 6));
        assert!(t.is_head(&victim, "orders-0-5", 5));
        assert!(!t.is_head(&other, "orders-0-5", 5));
        assert!(!t.is_head(&victim, "orders-0-5", 4));
        assert_eq!(t.holds(&victim, "orders-0-5", 5), Some(true));
        assert_eq!(t.holds(&victim, "orders-0-5", 3), Some(false));
        assert_eq!(t.holds(&other, "orders-0-5", 5), None);
        // The other key parks behind a message carrying the victim's id.
        t.apply(head(&other, "orders-0-5", 40));
        assert!(!t.settled(&victim, "orders-0-5", 40));
        assert_eq!(t.holds(&victim, "orders-0-5", 40), Some(false));
        t.apply(release(&other, "orders-0-5", ReleaseCause::Resolved));
        assert_eq!(
            t.head_of(&victim),
            Some(("orders-0-5".into(), KeyState::Parked))
        );
        assert_eq!(t.admit(&victim, 7, "m7"), Admission::Park);
    }

    #[test]
    fn a_key_past_its_share_is_told_so_and_under_dead_letter_key_stays_so_until_released() {
        for (policy, sticks) in [
            (KeyDeadLetter::Continue, false),
            (KeyDeadLetter::DeadLetterKey, true),
        ] {
            let t = ParkTable::new("orders", "orders.parked", policy, (10_000, 400), inputs());
            let (k, other) = (lane("k"), lane("other"));
            assert!(!t.over_share(&k, 1_000), "a free key parks nothing");
            t.apply(head(&k, "m0", 0));
            t.apply(head(&other, "o0", 0));
            t.apply(parked(&k, 1));
            t.apply(parked(&k, 2));
            assert!(!t.over_share(&k, 106));
            assert!(t.over_share(&k, 200), "past 400 bytes");
            assert!(!t.over_share(&other, 200), "another key has its own share");
            assert_eq!(t.over_share(&k, 1), sticks, "{policy:?}");
            t.apply(release(&k, "m0", ReleaseCause::Operator));
            assert!(!t.over_share(&k, 1), "released");
        }
    }
}
