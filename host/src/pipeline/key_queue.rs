//! The order in which a partition's waiting messages may start.
//!
//! A message carries a key (a hash of its Kafka key under `key`, the same
//! key for every message under `partition`) or none (`unordered`, or a
//! message without a Kafka key under `key`). Two messages of one key never
//! run at once, and they start in offset order; a message of no key starts
//! whenever a slot is free. Among the messages allowed to start, the oldest
//! goes first.
//!
//! Each key has its own FIFO, and a heap holds, for every idle key with a
//! message waiting, the sequence of that message. A take therefore costs
//! `O(log keys)`, whatever waits behind a busy key: a hot key with 100,000
//! messages at the head of the queue is never scanned.

use crate::config::MessageOrder;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// The queue key of a message with Kafka key `key`, under `ordering`.
pub fn key_of(ordering: MessageOrder, key: Option<&[u8]>, hasher: &KeyHasher) -> Option<u64> {
    match ordering {
        MessageOrder::Partition => Some(0),
        MessageOrder::Key => key.map(|k| hasher.hash(k)),
        MessageOrder::Unordered => None,
    }
}

/// Hashes Kafka keys into queue keys, with foldhash's quality hasher under
/// a random state per pipeline: fast on short keys, where SipHash (std's
/// default) cost a visible share of a no-op route's CPU, and with no
/// collision that holds whatever the seed, so keys a sender crafts to
/// collide collide only by chance. Two keys that do collide merely run one
/// at a time.
#[derive(Debug, Clone, Default)]
pub struct KeyHasher {
    state: foldhash::quality::RandomState,
}

impl KeyHasher {
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.state.hash_one(key)
    }
}

/// Passes a queue key through unchanged: queue keys are already well-mixed
/// hashes, so hashing them again would be wasted work.
#[derive(Default)]
pub struct Unhashed(u64);

impl Hasher for Unhashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; this keeps other input well-defined.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map by queue key.
pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<Unhashed>>;

/// Waiting items (messages, in the pipeline) and the keys with a call
/// running.
#[derive(Debug)]
pub struct KeyQueue<T> {
    /// Items of no key, oldest first, by sequence.
    free: VecDeque<(u64, T)>,
    /// Keys with a call running or items waiting.
    keys: KeyMap<KeyLane<T>>,
    /// The idle keys with an item waiting, by that item's sequence: exactly
    /// one entry per such key.
    ready: BinaryHeap<Reverse<(u64, u64)>>,
    /// The sequence of the next item pushed.
    next: u64,
    /// Items waiting.
    len: usize,
}

#[derive(Debug)]
struct KeyLane<T> {
    /// A call of this key is running.
    busy: bool,
    waiting: VecDeque<(u64, T)>,
}

impl<T> Default for KeyLane<T> {
    fn default() -> Self {
        KeyLane {
            busy: false,
            waiting: VecDeque::new(),
        }
    }
}

impl<T> Default for KeyQueue<T> {
    fn default() -> Self {
        KeyQueue {
            free: VecDeque::new(),
            keys: KeyMap::default(),
            ready: BinaryHeap::new(),
            next: 0,
            len: 0,
        }
    }
}

impl<T> KeyQueue<T> {
    /// Adds an item after every item pushed before.
    pub fn push(&mut self, key: Option<u64>, item: T) {
        let seq = self.next;
        self.next += 1;
        self.len += 1;
        match key {
            None => self.free.push_back((seq, item)),
            Some(k) => {
                let lane = self.keys.entry(k).or_default();
                if !lane.busy && lane.waiting.is_empty() {
                    self.ready.push(Reverse((seq, k)));
                }
                lane.waiting.push_back((seq, item));
            }
        }
    }

    /// The oldest waiting item allowed to start now, with its key, which is
    /// busy until [`KeyQueue::done`].
    pub fn take(&mut self) -> Option<(Option<u64>, T)> {
        let keyed = self.ready.peek().map(|Reverse((seq, _))| *seq);
        let free = self.free.front().map(|(seq, _)| *seq);
        if free.is_some_and(|f| keyed.is_none_or(|k| f < k)) {
            let (_, item) = self.free.pop_front().expect("peeked above");
            self.len -= 1;
            return Some((None, item));
        }
        let Reverse((_, key)) = self.ready.pop()?;
        let lane = self.keys.get_mut(&key).expect("a ready key has a lane");
        let (_, item) = lane
            .waiting
            .pop_front()
            .expect("a ready key has an item waiting");
        lane.busy = true;
        self.len -= 1;
        Some((Some(key), item))
    }

    /// The call of `key` ended: its next item may start.
    pub fn done(&mut self, key: u64) {
        let Some(lane) = self.keys.get_mut(&key) else {
            return;
        };
        lane.busy = false;
        match lane.waiting.front() {
            Some((seq, _)) => self.ready.push(Reverse((*seq, key))),
            None => _ = self.keys.remove(&key),
        }
    }

    /// Drops every waiting item; keys with a call running stay busy until
    /// their [`KeyQueue::done`].
    pub fn clear(&mut self) {
        self.free.clear();
        self.ready.clear();
        self.keys.retain(|_, lane| {
            lane.waiting.clear();
            lane.busy
        });
        self.len = 0;
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Pushes `(key, offset)` pairs.
    fn queue(items: &[(Option<u64>, i64)]) -> KeyQueue<i64> {
        let mut queue = KeyQueue::default();
        for (key, offset) in items {
            queue.push(*key, *offset);
        }
        queue
    }

    fn offsets(taken: &[(Option<u64>, i64)]) -> Vec<i64> {
        taken.iter().map(|(_, o)| *o).collect()
    }

    /// Takes until nothing may start.
    fn take_all(queue: &mut KeyQueue<i64>) -> Vec<(Option<u64>, i64)> {
        std::iter::from_fn(|| queue.take()).collect()
    }

    #[test]
    fn keys_hash_apart_and_alike() {
        let hasher = KeyHasher::default();
        let keys: Vec<Vec<u8>> = (0..10_000u32)
            .map(|i| format!("order-{i}").into_bytes())
            .chain([vec![], vec![0], vec![0, 0], vec![0; 8], vec![0; 9]])
            .collect();
        let hashes: HashSet<u64> = keys.iter().map(|k| hasher.hash(k)).collect();
        assert_eq!(hashes.len(), keys.len(), "no collision among these keys");
        assert_eq!(hasher.hash(b"order-7"), hasher.clone().hash(b"order-7"));
        assert_ne!(
            hasher.hash(b"order-7"),
            KeyHasher::default().hash(b"order-7"),
            "seeded per pipeline"
        );
    }

    #[test]
    fn keys_crafted_to_collide_under_every_seed_do_not() {
        // Flipping byte 7 by 0x80 and byte 10 by 0x40 gave the same hash
        // under every seed of the multiply-rotate hash this queue once used
        // (64 of 64 seeds), so two such keys never ran at once under
        // `ordering = "key"`.
        let a = *b"order-0000000042";
        let mut b = a;
        b[7] ^= 0x80;
        b[10] ^= 0x40;
        let collisions = (0..64)
            .filter(|_| {
                let hasher = KeyHasher::default();
                hasher.hash(&a) == hasher.hash(&b)
            })
            .count();
        assert_eq!(collisions, 0, "of 64 seeds");
    }

    #[test]
    fn one_key_runs_one_at_a_time_in_offset_order() {
        let mut g = queue(&[(Some(1), 0), (Some(2), 1), (Some(1), 2), (Some(1), 3)]);
        assert_eq!(offsets(&take_all(&mut g)), vec![0, 1], "2 and 3 wait on 0");
        g.done(1);
        assert_eq!(offsets(&take_all(&mut g)), vec![2]);
        g.done(2);
        assert_eq!(g.take(), None, "key 2 has nothing more; key 1 is busy");
        g.done(1);
        assert_eq!(offsets(&take_all(&mut g)), vec![3]);
        g.done(1);
        assert!(g.is_empty());
        assert!(g.keys.is_empty(), "idle keys are forgotten");
    }

    #[test]
    fn the_three_orderings() {
        let hasher = KeyHasher::default();
        let keys: [Option<&[u8]>; 5] = [Some(b"a"), Some(b"b"), Some(b"a"), None, Some(b"c")];
        let with = |ordering| {
            let mut g = KeyQueue::default();
            for (offset, key) in keys.iter().enumerate() {
                g.push(key_of(ordering, *key, &hasher), offset as i64);
            }
            g
        };
        // partition: one at a time, in order.
        let mut g = with(MessageOrder::Partition);
        assert_eq!(offsets(&take_all(&mut g)), vec![0]);
        g.done(0);
        assert_eq!(offsets(&take_all(&mut g)), vec![1]);
        // key: one per key; `a`'s second message waits; the keyless one
        // runs at once.
        let mut g = with(MessageOrder::Key);
        assert_eq!(offsets(&take_all(&mut g)), vec![0, 1, 3, 4]);
        g.done(key_of(MessageOrder::Key, Some(b"a"), &hasher).unwrap());
        assert_eq!(offsets(&take_all(&mut g)), vec![2]);
        // unordered: everything at once, oldest first.
        let mut g = with(MessageOrder::Unordered);
        assert_eq!(offsets(&take_all(&mut g)), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn the_oldest_startable_goes_first_across_keys_and_keyless() {
        let mut g = queue(&[(None, 0), (Some(7), 1), (None, 2), (Some(8), 3), (None, 4)]);
        assert_eq!(offsets(&take_all(&mut g)), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_hot_key_at_the_head_is_not_scanned() {
        const HOT: i64 = 200_000;
        let mut g = KeyQueue::default();
        for offset in 0..HOT {
            g.push(Some(1), offset);
        }
        g.push(Some(2), HOT);
        assert_eq!(g.take(), Some((Some(1), 0)));
        assert_eq!(
            g.take(),
            Some((Some(2), HOT)),
            "the other key overtakes the waiting hot key"
        );
        assert_eq!(g.take(), None);
        assert!(
            g.ready.is_empty(),
            "a busy key has no entry to scan past, however much waits behind it"
        );
        // One take and done per message; a scan past the hot key's waiting
        // messages on each take would not finish.
        for offset in 1..HOT {
            g.done(1);
            assert_eq!(g.take(), Some((Some(1), offset)));
            assert!(g.ready.len() <= 1);
        }
        g.done(1);
        assert!(g.is_empty());
    }

    #[test]
    fn clear_keeps_running_keys_busy() {
        let mut g = queue(&[(Some(1), 0), (Some(1), 1), (Some(2), 2)]);
        assert_eq!(g.take(), Some((Some(1), 0)));
        g.clear();
        assert_eq!(g.len(), 0);
        g.push(Some(1), 3);
        assert_eq!(g.take(), None, "key 1 still runs offset 0");
        g.done(1);
        assert_eq!(g.take(), Some((Some(1), 3)));
    }

    #[test]
    fn done_of_an_unknown_key_is_harmless() {
        let mut g = queue(&[(Some(1), 0)]);
        g.done(99);
        assert_eq!(g.take(), Some((Some(1), 0)));
        g.done(1);
        g.done(1);
        assert_eq!(g.take(), None);
    }

    /// A random interleaving of pushes, takes and dones never runs two items
    /// of a key at once, and starts each key's items in push order.
    #[test]
    fn no_overlap_and_per_key_order_under_random_interleavings() {
        use proptest::prelude::*;
        proptest!(|(ops in proptest::collection::vec((0u8..3, 0u64..5, any::<bool>()), 1..400))| {
            let mut g = KeyQueue::default();
            let mut running: HashSet<Option<u64>> = HashSet::new();
            let mut last: HashMap<u64, i64> = HashMap::new();
            let mut pushed = 0i64;
            let mut taken = 0i64;
            for (op, key, keyless) in ops {
                match op {
                    0 => {
                        g.push((!keyless).then_some(key), pushed);
                        pushed += 1;
                    }
                    1 => {
                        if let Some((k, offset)) = g.take() {
                            taken += 1;
                            if let Some(k) = k {
                                prop_assert!(running.insert(Some(k)), "key {} overlaps", k);
                                prop_assert!(last.get(&k).is_none_or(|l| *l < offset));
                                last.insert(k, offset);
                            }
                        }
                    }
                    _ => {
                        if running.remove(&Some(key)) {
                            g.done(key);
                        }
                    }
                }
            }
            for k in running.into_iter().flatten() {
                g.done(k);
            }
            // Nothing is lost: with every call ended, all that waits starts.
            while let Some((k, _)) = g.take() {
                taken += 1;
                if let Some(k) = k {
                    g.done(k);
                }
            }
            prop_assert_eq!(taken, pushed);
            prop_assert!(g.is_empty());
        });
    }
}
