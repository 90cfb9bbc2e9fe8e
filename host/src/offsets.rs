//! Which offset of a partition is safe to commit.
//!
//! Messages of one partition are handled in offset order, but their hops are
//! acknowledged in any order. The tracker keeps the offsets that were
//! dispatched and are not yet done; the committable position is the lowest of
//! them, or one past the highest dispatched offset when none is pending. An
//! offset is therefore committed only when it and everything before it are
//! done — never past a message whose hop is still in flight.

use std::collections::BTreeSet;

#[derive(Debug, Default)]
pub struct OffsetTracker {
    pending: BTreeSet<i64>,
    /// One past the highest offset dispatched so far.
    next: Option<i64>,
    /// The position last reported by [`OffsetTracker::complete`].
    stored: Option<i64>,
    /// That position, until [`OffsetTracker::take_unstored`] takes it.
    unstored: Option<i64>,
}

impl OffsetTracker {
    /// Records that `offset` was dispatched. Offsets arrive in increasing
    /// order per partition.
    pub fn begin(&mut self, offset: i64) {
        self.pending.insert(offset);
        // Committing the first offset seen would be a no-op.
        self.stored.get_or_insert(offset);
        self.next = Some(self.next.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// Marks `offset` done. Returns the new committable position (the next
    /// offset to consume) when it moved forward.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        self.pending.remove(&offset);
        let position = match self.pending.first() {
            Some(&lowest) => lowest,
            None => self.next?,
        };
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
        self.pending.first().copied().or(self.next)
    }

    /// The committable position, if it moved since the last call.
    pub fn take_unstored(&mut self) -> Option<i64> {
        self.unstored.take()
    }

    /// Messages dispatched and not yet done.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
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
}
