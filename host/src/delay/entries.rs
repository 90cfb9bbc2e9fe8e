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
/// memory reaches first (they would take ~280 GB).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Full;

/// Entries by id.
pub(super) struct Entries {
    hasher: RandomState,
    /// Each entry's place in `slots`.
    index: HashTable<u32>,
    slots: Vec<Slot>,
}

impl Entries {
    pub(super) fn new() -> Entries {
        Entries {
            // SipHash with a random key: ids come from any producer.
            hasher: RandomState::new(),
            index: HashTable::new(),
            slots: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    fn hash(&self, id: &[u8]) -> u64 {
        self.hasher.hash_one(id)
    }

    fn place(&self, id: &[u8]) -> Option<usize> {
        self.place_hashed(self.hash(id), id)
    }

    fn place_hashed(&self, hash: u64, id: &[u8]) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slots[i as usize].id.as_bytes() == id)
            .map(|&i| i as usize)
    }

    pub(super) fn get(&self, id: &[u8]) -> Option<&Entry> {
        self.place(id).map(|i| &self.slots[i].entry)
    }

    pub(super) fn get_mut(&mut self, id: &[u8]) -> Option<&mut Entry> {
        self.place(id).map(|i| &mut self.slots[i].entry)
    }

    /// Sets the entry of `id`, replacing the one it had.
    pub(super) fn insert(&mut self, id: &[u8], entry: Entry) -> Result<(), Full> {
        let hash = self.hash(id);
        if let Some(i) = self.place_hashed(hash, id) {
            self.slots[i].entry = entry;
            return Ok(());
        }
        let next = match u32::try_from(self.slots.len()) {
            Ok(next) if next < u32::MAX => next,
            _ => return Err(Full),
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, next, |&i| {
            hasher.hash_one(slots[i as usize].id.as_bytes())
        });
        self.slots.push(Slot {
            id: Id::new(id),
            entry,
        });
        Ok(())
    }

    /// Removes the entry of `id`, if it has one.
    pub(super) fn remove(&mut self, id: &[u8]) -> Option<Entry> {
        let i = self.place(id)?;
        Some(self.remove_at(i).1)
    }

    /// Removes every entry for which `keep` is false, and returns them with
    /// their ids.
    pub(super) fn drain_unless(
        &mut self,
        mut keep: impl FnMut(&Entry) -> bool,
    ) -> Vec<(Vec<u8>, Entry)> {
        let mut removed = Vec::new();
        // From the end: the entry moved into a freed place is one already
        // looked at and kept.
        for i in (0..self.slots.len()).rev() {
            if !keep(&self.slots[i].entry) {
                removed.push(self.remove_at(i));
            }
        }
        removed
    }

    /// Removes the entry at `i`, moving the last entry into its place.
    fn remove_at(&mut self, i: usize) -> (Vec<u8>, Entry) {
        let hash = self.hash(self.slots[i].id.as_bytes());
        let at = i as u32;
        self.index
            .find_entry(hash, |&j| j == at)
            .expect("every entry has its place in the index")
            .remove();
        let last = self.slots.len() - 1;
        if i != last {
            let hash = self.hash(self.slots[last].id.as_bytes());
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
        Entry {
            at: InboxPosition {
                partition: 0,
                offset,
            },
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
            assert_eq!(entries.get(id).unwrap().at.offset, n as i64, "{id:?}");
        }
        // Lengths a byte counts no more, and a key near the broker's
        // default record limit (1 MiB).
        let (at_255, at_256, huge) = (vec![b'z'; 255], vec![b'z'; 256], vec![0xa5; 1 << 20]);
        for (n, id) in [&at_255, &at_256, &huge].into_iter().enumerate() {
            entries.insert(id, entry(100 + n as i64, 0)).unwrap();
        }
        assert_eq!(entries.get(&at_255).unwrap().at.offset, 100);
        assert_eq!(entries.get(&at_256).unwrap().at.offset, 101);
        assert_eq!(entries.get(&huge).unwrap().at.offset, 102);
        assert_eq!(entries.remove(&huge).unwrap().at.offset, 102);
        assert!(entries.get(&huge).is_none());
        assert_eq!(entries.len(), ids.len() + 2);
        assert!(entries.get(b"order-00000002").is_none());
        assert!(entries.get(&[b'y'; INLINE - 1]).is_none());
        assert!(entries.get(&long[..299]).is_none());
    }

    #[test]
    fn an_insert_of_a_known_id_replaces_its_entry() {
        let mut entries = Entries::new();
        entries.insert(b"a", entry(1, 0)).unwrap();
        entries.insert(b"a", entry(2, 0)).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.get(b"a").unwrap().at.offset, 2);
        entries.get_mut(b"a").unwrap().dropped = 7;
        assert_eq!(entries.get(b"a").unwrap().dropped, 7);
    }

    /// Against a `HashMap`, through many inserts, removes and sweeps that
    /// move entries around.
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
            // Short ids and long ones, from a small set so that ids recur.
            let id = if n % 3 == 0 {
                format!("a-long-id-that-is-boxed-{}", n % 500).into_bytes()
            } else {
                format!("id-{}", n % 500).into_bytes()
            };
            match next() % 10 {
                0..=5 => {
                    let expires = (next() % 100) as i64;
                    entries.insert(&id, entry(step, expires)).unwrap();
                    model.insert(id, (step, expires));
                }
                6..=8 => {
                    let got = entries.remove(&id).map(|e| (e.at.offset, e.expires_at));
                    assert_eq!(got, model.remove(&id));
                    removed += usize::from(got.is_some());
                }
                _ => {
                    let now = (next() % 100) as i64;
                    let mut gone: Vec<_> = entries
                        .drain_unless(|e| e.expires_at > now)
                        .into_iter()
                        .map(|(id, e)| (id, e.at.offset))
                        .collect();
                    let mut want: Vec<_> = model
                        .iter()
                        .filter(|(_, (_, expires))| *expires <= now)
                        .map(|(id, (offset, _))| (id.clone(), *offset))
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
        for (id, (offset, expires)) in &model {
            let e = entries.get(id).unwrap();
            assert_eq!((e.at.offset, e.expires_at), (*offset, *expires));
        }
        // The churn really moved entries: both ways of removing them ran.
        assert!(
            removed > 100 && swept > 1_000,
            "{removed} removed, {swept} swept"
        );
    }
}
