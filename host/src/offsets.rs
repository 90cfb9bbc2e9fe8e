//! Which offset of a partition is safe to commit.
//!
//! Messages of one partition are queued in offset order, but up to
//! `max_in_flight` of them are handled at once, and their hops are
//! acknowledged, in any order. The tracker keeps the offsets that were
//! queued and are not yet done; the committable position is the lowest of
//! them, or one past the highest dispatched offset when none is pending. An
//! offset is therefore committed only when it and everything before it are
//! done — never past a message whose hop is still in flight.

use std::collections::VecDeque;

#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Offsets dispatched, in increasing order, from the lowest not yet
    /// done; each with whether it is done. Offsets arrive in order, so a
    /// begin is a push at the back, a complete a binary search, and the done
    /// prefix is popped from the front: no allocation per offset.
    pending: VecDeque<(i64, bool)>,
    /// Offsets in `pending` not yet done.
    in_flight: usize,
    /// One past the highest offset dispatched so far.
    next: Option<i64>,
    /// The position last reported by [`OffsetTracker::complete`].
    stored: Option<i64>,
    /// That position, until [`OffsetTracker::take_unstored`] takes it.
    unstored: Option<i64>,
}

impl OffsetTracker {
    /// Records that `offset` was dispatched. Offsets arrive in increasing
    /// order per partition; one that does not (never expected) is still
    /// tracked, and one already pending is ignored.
    pub fn begin(&mut self, offset: i64) {
        match self.pending.back() {
            Some((last, _)) if *last >= offset => {
                match self.pending.binary_search_by_key(&offset, |(o, _)| *o) {
                    Ok(_) => return,
                    Err(at) => self.pending.insert(at, (offset, false)),
                }
            }
            _ => self.pending.push_back((offset, false)),
        }
        self.in_flight += 1;
        // Committing the first offset seen would be a no-op.
        self.stored.get_or_insert(offset);
        self.next = Some(self.next.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// Marks `offset` done. Returns the new committable position (the next
    /// offset to consume) when it moved forward.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        if let Ok(at) = self.pending.binary_search_by_key(&offset, |(o, _)| *o)
            && !self.pending[at].1
        {
            self.pending[at].1 = true;
            self.in_flight -= 1;
            while self.pending.front().is_some_and(|(_, done)| *done) {
                self.pending.pop_front();
            }
        }
        let position = self.position()?;
        if self.stored.is_some_and(|s| s >= position) {
            return None;
        }
        self.stored = Some(position);
        self.unstored = Some(position);
        Some(position)
    }

    /// The committable position now: the lowest offset not yet done, or one
    /// past the highest dispatched when all are done. `None` before the
    /// first offset.
    pub fn position(&self) -> Option<i64> {
        self.pending.front().map(|(o, _)| *o).or(self.next)
    }

    /// The committable position, if it moved since the last call.
    pub fn take_unstored(&mut self) -> Option<i64> {
        self.unstored.take()
    }

    /// Messages dispatched and not yet done.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_acks_commit_only_the_done_prefix() {
        let mut t = OffsetTracker::default();
        for o in 10..14 {
            t.begin(o);
        }
        assert_eq!(t.complete(12), None, "10 and 11 are still pending");
        assert_eq!(t.complete(10), Some(11));
        assert_eq!(t.complete(13), None, "11 is still pending");
        assert_eq!(t.complete(11), Some(14));
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.take_unstored(), Some(14), "only the latest position");
        assert_eq!(t.take_unstored(), None);
    }

    #[test]
    fn gaps_in_offsets_are_fine() {
        let mut t = OffsetTracker::default();
        t.begin(5);
        t.begin(9);
        assert_eq!(t.complete(5), Some(9));
        assert_eq!(t.complete(9), Some(10));
    }

    #[test]
    fn a_repeated_or_unknown_completion_changes_nothing() {
        let mut t = OffsetTracker::default();
        t.begin(3);
        t.begin(4);
        assert_eq!(t.complete(4), None);
        assert_eq!(t.complete(4), None, "completed twice");
        assert_eq!(t.complete(99), None, "never begun");
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.position(), Some(3));
        assert_eq!(t.complete(3), Some(5));
    }

    #[test]
    fn an_offset_begun_twice_is_tracked_once() {
        let mut t = OffsetTracker::default();
        t.begin(1);
        t.begin(2);
        t.begin(1);
        assert_eq!(t.in_flight(), 2);
        assert_eq!(t.complete(1), Some(2));
        assert_eq!(t.complete(2), Some(3));
    }

    /// Whatever order the acknowledgements come in, the position is always
    /// the lowest offset not yet done: never past one still in flight.
    #[test]
    fn the_position_never_passes_an_offset_in_flight() {
        use proptest::prelude::*;
        proptest!(|(gaps in proptest::collection::vec(1i64..4, 1..200), seed in any::<u64>())| {
            let mut t = OffsetTracker::default();
            let mut offsets = Vec::new();
            let mut o = 0;
            for gap in gaps {
                o += gap;
                t.begin(o);
                offsets.push(o);
            }
            // A deterministic shuffle from the seed.
            let mut acks = offsets.clone();
            let mut state = seed | 1;
            for i in (1..acks.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                acks.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut done = std::collections::BTreeSet::new();
            for ack in acks {
                done.insert(ack);
                t.complete(ack);
                let lowest_open = offsets.iter().find(|o| !done.contains(o)).copied();
                prop_assert_eq!(t.position(), lowest_open.or(Some(o + 1)));
            }
            prop_assert_eq!(t.in_flight(), 0);
        });
    }
}
