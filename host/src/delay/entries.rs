//! The cancellation table's entries, packed: a pending cancellation may
//! take under 200 bytes (docs/operations.md, "Cancelling and replacing").
//!
//! A `HashMap<Box<[u8]>, Entry>` spent ~119 bytes on each: at a million
//! entries hashbrown has just grown to 2^21 buckets of 49 bytes, less than
//! half of them full, and each id was an allocation of its own. Here the
//! entries sit side by side in one vector, each id inline when it is short,
//! and the hash table holds only each entry's place in the vector: 4 bytes
//! and a control byte per bucket. A million entries then take ~69 bytes
//! each (56 in the vector, which grows to 2^20 slots, and ~10 in the index).
//!
//! Removing an entry moves the last one into its place, so the order of the
//! entries is not the order they came in; nothing reads them in order.
//!
//! An entry is one id's cancellation in one inbox partition: the table is
//! keyed by (partition, id), and the partition is the one in the entry's
//! position, so it costs no byte more.

use crate::types::{CancelKind, InboxPosition};
use hashbrown::HashTable;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// Ids up to this many bytes are kept in the entry itself.
const INLINE: usize = 22;

/// An entry's id: inline when it is at most [`INLINE`] bytes (an id like
/// `order-00000001`), else boxed.
enum Id {
    Inline { len: u8, bytes: [u8; INLINE] },
    Boxed(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<Id>() == 24);
const _: () = assert!(std::mem::size_of::<Slot>() == 56);

impl Id {
    fn new(id: &[u8]) -> Id {
        match u8::try_from(id.len()) {
            Ok(len) if id.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..id.len()].copy_from_slice(id);
                Id::Inline { len, bytes }
            }
            _ => Id::Boxed(id.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Id::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Id::Boxed(bytes) => bytes,
        }
    }
}

/// One pending cancellation: 32 bytes, beside its id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) at: InboxPosition,
    pub(super) expires_at: i64,
    /// Schedules this process dropped because of it.
    pub(super) dropped: u32,
    pub(super) kind: CancelKind,
    /// This process read the cancel from the inbox and wrote the entry.
    pub(super) mine: bool,
    /// This process had forwarded a schedule it covers before it knew it.
    pub(super) too_late: bool,
}

struct Slot {
    id: Id,
    entry: Entry,
}

/// The table is full: it holds `u32::MAX` entries, which no machine's
/// memory reaches first (they would take ~280 GB); the configured bound
/// (`[delay] max_cancellations`) stops it long before.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Full;

/// Entries by (inbox partition, id).
pub(super) struct Entries {
    hasher: RandomState,
    /// Each entry's place in `slots`.
    index: HashTable<u32>,
    slots: Vec<Slot>,
    /// One more than the highest inbox partition an entry was read from:
    /// the partitions an id may have entries in.
    partitions: i32,
}

impl Entries {
    pub(super) fn new() -> Entries {
        Entries {
            // SipHash with a random key: ids come from any producer.
            hasher: RandomState::new(),
            index: HashTable::new(),
            slots: Vec::new(),
            partitions: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// One more than the highest inbox partition an entry was read from.
    pub(super) fn partitions(&self) -> i32 {
        self.partitions
    }

    fn hash(&self, partition: i32, id: &[u8]) -> u64 {
        self.hasher.hash_one((partition, id))
    }

    fn slot_hash(&self, slot: &Slot) -> u64 {
        self.hash(slot.entry.at.partition, slot.id.as_bytes())
    }

    fn place(&self, partition: i32, id: &[u8]) -> Option<usize> {
        self.place_hashed(self.hash(partition, id), partition, id)
    }

    fn place_hashed(&self, hash: u64, partition: i32, id: &[u8]) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| {
                let slot = &slots[i as usize];
                slot.entry.at.partition == partition && slot.id.as_bytes() == id
            })
            .map(|&i| i as usize)
    }

    pub(super) fn get(&self, partition: i32, id: &[u8]) -> Option<&Entry> {
        self.place(partition, id).map(|i| &self.slots[i].entry)
    }

    pub(super) fn get_mut(&mut self, partition: i32, id: &[u8]) -> Option<&mut Entry> {
        self.place(partition, id).map(|i| &mut self.slots[i].entry)
    }

    /// Sets the entry of `id` in the partition of `entry.at`, replacing the
    /// one it had there.
    pub(super) fn insert(&mut self, id: &[u8], entry: Entry) -> Result<(), Full> {
        let partition = entry.at.partition;
        let hash = self.hash(partition, id);
        if let Some(i) = self.place_hashed(hash, partition, id) {
            self.slots[i].entry = entry;
            return Ok(());
        }
        let next = match u32::try_from(self.slots.len()) {
            Ok(next) if next < u32::MAX => next,
            _ => return Err(Full),
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, next, |&i| {
            let slot = &slots[i as usize];
            hasher.hash_one((slot.entry.at.partition, slot.id.as_bytes()))
        });
        self.slots.push(Slot {
            id: Id::new(id),
            entry,
        });
        self.partitions = self.partitions.max(partition.saturating_add(1));
        Ok(())
    }

    /// Removes the entry of `id` in `partition`, if it has one.
    pub(super) fn remove(&mut self, partition: i32, id: &[u8]) -> Option<Entry> {
        let i = self.place(partition, id)?;
        Some(self.remove_at(i).1)
    }

    /// Looks at the entries at places `below - slice .. below` (fewer at the
    /// start of the vector), from the last, removes every one for which
    /// `keep` is false, and returns them with their ids, and the place the
    /// next slice starts below (0: this was the last). One slice holds the
    /// caller's lock for `slice` entries at most, however many the table
    /// has.
    ///
    /// From the end: the entry moved into a freed place is one at or above
    /// it, already looked at and kept, or one inserted since the slice
    /// before, which the next sweep looks at.
    pub(super) fn sweep_slice(
        &mut self,
        below: usize,
        slice: usize,
        mut keep: impl FnMut(&Entry) -> bool,
    ) -> (Vec<(Vec<u8>, Entry)>, usize) {
        let below = below.min(self.slots.len());
        let from = below.saturating_sub(slice);
        let mut removed = Vec::new();
        for i in (from..below).rev() {
            if !keep(&self.slots[i].entry) {
                removed.push(self.remove_at(i));
            }
        }
        (removed, from)
    }

    /// Removes the entry at `i`, moving the last entry into its place.
    fn remove_at(&mut self, i: usize) -> (Vec<u8>, Entry) {
        let hash = self.slot_hash(&self.slots[i]);
        let at = i as u32;
        self.index
            .find_entry(hash, |&j| j == at)
            .expect("every entry has its place in the index")
            .remove();
        let last = self.slots.len() - 1;
        if i != last {
            let hash = self.slot_hash(&self.slots[last]);
            let moved = last as u32;
            *self
                .index
                .find_mut(hash, |&j| j == moved)
                .expect("every entry has its place in the index") = at;
        }
        let slot = self.slots.swap_remove(i);
        (slot.id.as_bytes().to_vec(), slot.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: i64, expires_at: i64) -> Entry {
        entry_in(0, offset, expires_at)
    }

    fn entry_in(partition: i32, offset: i64, expires_at: i64) -> Entry {
        Entry {
            at: InboxPosition { partition, offset },
            expires_at,
            dropped: 0,
            kind: CancelKind::Cancel,
            mine: false,
            too_late: false,
        }
    }

    #[test]
    fn short_and_long_ids_are_kept_apart_and_found() {
        let mut entries = Entries::new();
        let long = vec![b'x'; 300];
        let ids: Vec<&[u8]> = vec![
            b"",
            b"a",
            b"order-00000001",
            &[b'y'; INLINE],
            &[b'y'; INLINE + 1],
            &long,
            &[0xff, 0x00, 0xfe],
        ];
        for (n, id) in ids.iter().enumerate() {
            entries.insert(id, entry(n as i64, 0)).unwrap();
        }
        assert_eq!(entries.len(), ids.len());
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(entries.get(0, id).unwrap().at.offset, n as i64, "{id:?}");
        }
        // Lengths a byte counts no more, and a key near the broker's
        // default record limit (1 MiB).
        let (at_255, at_256, huge) = (vec![b'z'; 255], vec![b'z'; 256], vec![0xa5; 1 << 20]);
        for (n, id) in [&at_255, &at_256, &huge].into_iter().enumerate() {
            entries.insert(id, entry(100 + n as i64, 0)).unwrap();
        }
        assert_eq!(entries.get(0, &at_255).unwrap().at.offset, 100);
        assert_eq!(entries.get(0, &at_256).unwrap().at.offset, 101);
        assert_eq!(entries.get(0, &huge).unwrap().at.offset, 102);
        assert_eq!(entries.remove(0, &huge).unwrap().at.offset, 102);
        assert!(entries.get(0, &huge).is_none());
        assert_eq!(entries.len(), ids.len() + 2);
        assert!(entries.get(0, b"order-00000002").is_none());
        assert!(entries.get(0, &[b'y'; INLINE - 1]).is_none());
        assert!(entries.get(0, &long[..299]).is_none());
    }

    #[test]
    fn an_insert_of_a_known_id_replaces_its_entry() {
        let mut entries = Entries::new();
        entries.insert(b"a", entry(1, 0)).unwrap();
        entries.insert(b"a", entry(2, 0)).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.get(0, b"a").unwrap().at.offset, 2);
        entries.get_mut(0, b"a").unwrap().dropped = 7;
        assert_eq!(entries.get(0, b"a").unwrap().dropped, 7);
    }

    #[test]
    fn one_id_has_an_entry_per_partition() {
        let mut entries = Entries::new();
        entries.insert(b"inv-42", entry_in(1, 10, 0)).unwrap();
        entries.insert(b"inv-42", entry_in(0, 20, 0)).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries.partitions(), 2);
        assert_eq!(entries.get(1, b"inv-42").unwrap().at.offset, 10);
        assert_eq!(entries.get(0, b"inv-42").unwrap().at.offset, 20);
        assert!(entries.get(2, b"inv-42").is_none());
        assert_eq!(entries.remove(0, b"inv-42").unwrap().at.offset, 20);
        assert_eq!(entries.get(1, b"inv-42").unwrap().at.offset, 10);
    }

    /// Against a `HashMap`, through many inserts, removes and sweeps in
    /// slices that move entries around.
    #[test]
    fn removing_moves_entries_without_losing_any() {
        let mut entries = Entries::new();
        let mut model = std::collections::HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut removed, mut swept) = (0, 0);
        for step in 0..20_000_i64 {
            let n = next();
            // Short ids and long ones, from a small set so that ids recur,
            // in three partitions.
            let partition = (next() % 3) as i32;
            let id = if n % 3 == 0 {
                format!("a-long-id-that-is-boxed-{}", n % 100).into_bytes()
            } else {
                format!("id-{}", n % 100).into_bytes()
            };
            match next() % 10 {
                0..=5 => {
                    let expires = (next() % 100) as i64;
                    entries
                        .insert(&id, entry_in(partition, step, expires))
                        .unwrap();
                    model.insert((partition, id), (step, expires));
                }
                6..=8 => {
                    let got = entries
                        .remove(partition, &id)
                        .map(|e| (e.at.offset, e.expires_at));
                    assert_eq!(got, model.remove(&(partition, id)));
                    removed += usize::from(got.is_some());
                }
                _ => {
                    let now = (next() % 100) as i64;
                    let slice = 1 + (next() % 64) as usize;
                    let mut gone = Vec::new();
                    let mut below = entries.len();
                    loop {
                        let (out, next_below) =
                            entries.sweep_slice(below, slice, |e| e.expires_at > now);
                        assert!(below - next_below <= slice);
                        gone.extend(
                            out.into_iter()
                                .map(|(id, e)| ((e.at.partition, id), e.at.offset)),
                        );
                        below = next_below;
                        if below == 0 {
                            break;
                        }
                    }
                    let mut want: Vec<_> = model
                        .iter()
                        .filter(|(_, (_, expires))| *expires <= now)
                        .map(|(key, (offset, _))| (key.clone(), *offset))
                        .collect();
                    model.retain(|_, (_, expires)| *expires > now);
                    gone.sort();
                    want.sort();
                    assert_eq!(gone, want);
                    swept += gone.len();
                }
            }
            assert_eq!(entries.len(), model.len());
        }
        for ((partition, id), (offset, expires)) in &model {
            let e = entries.get(*partition, id).unwrap();
            assert_eq!((e.at.offset, e.expires_at), (*offset, *expires));
        }
        // The churn really moved entries: both ways of removing them ran.
        assert!(
            removed > 100 && swept > 1_000,
            "{removed} removed, {swept} swept"
        );
    }
}
