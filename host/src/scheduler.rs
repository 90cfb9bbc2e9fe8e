//! The in-memory scheduler for the last stretch of a delay.
//!
//! Tiers hold a message until less than the smallest tier remains; then it
//! waits here, in memory, until its exact deliver-at. It only ever holds
//! messages due within about one smallest tier, so its size is bounded by
//! rate × smallest tier, not by the number of pending messages. The Kafka
//! offset stays uncommitted until the forward is acknowledged, so a crash
//! loses nothing held here: the message is read again from its tier.

use crate::clock::now_ms;
use crate::hop::{Completion, PlannedHop};
use crate::produce::HopProducer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A hop to produce at `at_ms` (epoch ms), and whose offset it completes.
pub struct Scheduled {
    pub at_ms: i64,
    pub hop: PlannedHop,
    pub done: Completion,
}

/// Entries ordered by due time; ties keep arrival order.
pub struct Timeline<T> {
    entries: BTreeMap<(i64, u64), T>,
    seq: u64,
}

impl<T> Default for Timeline<T> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<T> Timeline<T> {
    pub fn push(&mut self, at_ms: i64, item: T) {
        self.seq += 1;
        self.entries.insert((at_ms, self.seq), item);
    }

    pub fn next_due(&self) -> Option<i64> {
        self.entries.keys().next().map(|(at, _)| *at)
    }

    /// Every entry due at `now_ms`, earliest first. Never one that is not.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<T> {
        let later = self.entries.split_off(&(now_ms + 1, 0));
        let due = std::mem::replace(&mut self.entries, later);
        due.into_values().collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

pub struct Scheduler;

impl Scheduler {
    /// Starts the scheduler task of a pipeline. It ends at shutdown, or when
    /// every sender is dropped.
    pub fn spawn(
        producer: Arc<HopProducer>,
        shutdown: CancellationToken,
    ) -> mpsc::UnboundedSender<Scheduled> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(producer, rx, shutdown));
        tx
    }
}

async fn run(
    producer: Arc<HopProducer>,
    mut rx: mpsc::UnboundedReceiver<Scheduled>,
    shutdown: CancellationToken,
) {
    let mut timeline: Timeline<Scheduled> = Timeline::default();
    loop {
        let wake = timeline.next_due().map(|at| {
            let wait = (at - now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait))
        });
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = async { match wake { Some(s) => s.await, None => std::future::pending().await } } => {
                for mut due in timeline.take_due(now_ms()) {
                    due.hop.record.timestamp = now_ms();
                    producer.send(due.hop, due.done).await;
                }
            }
            item = rx.recv() => match item {
                Some(item) => timeline.push(item.at_ms, item),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_what_is_due_in_order() {
        let mut t = Timeline::default();
        t.push(30, "c");
        t.push(10, "a");
        t.push(10, "b");
        t.push(31, "d");
        assert_eq!(t.take_due(9), Vec::<&str>::new());
        assert_eq!(t.take_due(30), vec!["a", "b", "c"]);
        assert_eq!(t.next_due(), Some(31));
        assert_eq!(t.len(), 1);
    }
}
