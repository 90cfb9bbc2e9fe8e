//! A partition's task: it reads the partition's own queue, split off the
//! consumer's ([`super::context`]), and runs the partition's calls.
//!
//! The task takes a message only when it has room: fewer than
//! `max_in_flight` calls running and fewer than [`lookahead`] messages
//! waiting for their key. Otherwise it leaves the partition's queue alone,
//! so librdkafka's queue is the buffer and nothing fetched is thrown away
//! (`queued.max.messages.kbytes` bounds it per partition). When it has
//! room it takes whatever the queue already holds, up to the same bounds,
//! in one go rather than one message per wake-up. It starts calls
//! in the order the [`KeyQueue`] allows and polls each once where it starts
//! it: one that ends there (a handler that waits on no host call) costs no
//! allocation, and the rest run in [`InFlight`] (one alone polled directly,
//! several in a `FuturesUnordered`). The queue of
//! waiting messages,
//! like everything else here, is the task's own, so a message costs no
//! lock but its offset tracker's, shared with the producer's delivery
//! callback and the commit tick.
//!
//! A task that keeps finding work yields its worker once it has run for a
//! [`SLICE`](super::slice::SLICE), so the partitions on one worker share
//! it and an idle worker can take one of them. One whose calls mostly fail sleeps instead
//! while a healthy task waits for the CPU ([`Slice::record`]).
//!
//! A message of a tier that is not due yet stops the task: it reports the
//! hold to the loop, which pauses the partition and seeks back to that
//! message ([`super::pauses`]), and reads nothing until the loop releases it
//! once the message is due.

use super::Shared;
use super::context::PartitionQueue;
use super::in_flight::InFlight;
use super::key_queue::{KeyHasher, KeyQueue, key_of};
use super::slice::Slice;
use crate::clock::now_ms;
use crate::config::{Concurrency, MessageOrder};
use crate::hop::{Action, Completion, Processor, Written};
use crate::offsets::OffsetTracker;
use crate::scheduler::Scheduled;
use crate::types::TopicPartition;
use futures::FutureExt as _;
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt as _};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How often a task waiting for a message looks at its queue even without a
/// wake-up: librdkafka wakes a reader only when the queue turns non-empty,
/// and a wake-up lost in between must not stall the partition.
pub(super) const WAKE_FALLBACK: Duration = Duration::from_millis(100);
/// The key and payload bytes a task holds waiting for their key, at most.
const LOOKAHEAD_BYTES: usize = 16 << 20;

/// The messages a task reads ahead of its calls, at most: enough for keys
/// that are free to start while others are busy.
pub(super) fn lookahead(max_in_flight: usize) -> usize {
    max_in_flight.saturating_mul(4).max(256)
}

/// What the loop tells a partition's task.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Control {
    /// The partition of the hold the task reported is paused and sought
    /// back to the held message. What librdkafka fetched before the seek
    /// still sits in the partition's queue, outdated, until the queue is
    /// polled: poll it once now, which drops it, so an hour-long hold does
    /// not keep up to `queued.max.messages.kbytes` of it in memory.
    Flush,
    /// The hold the task reported is over and the partition was sought back
    /// to the held message: read on.
    Release,
    /// Revoked, or stopping: read nothing more, finish the calls running,
    /// and end.
    Close,
}

/// A tier message read before it is due, which the task did not take: the
/// loop rewinds the partition to it.
#[derive(Debug)]
pub(super) struct Held {
    pub tp: TopicPartition,
    pub offset: i64,
    pub due_ms: i64,
}

/// What a partition's task works with.
pub(super) struct Partition<P> {
    pub shared: Arc<Shared<P>>,
    pub tp: Arc<TopicPartition>,
    pub tracker: Arc<Mutex<OffsetTracker>>,
    pub concurrency: Concurrency,
    pub keys: KeyHasher,
    pub scheduler: mpsc::UnboundedSender<Scheduled>,
    pub held: mpsc::UnboundedSender<Held>,
    /// The last thing read was a batch that cannot be decoded.
    pub stuck: std::sync::atomic::AtomicBool,
}

/// What waits for its key's turn: a message read from the partition, or a
/// job of the processor's ([`Processor::jobs`]).
pub(super) enum Item<J> {
    Message(OwnedMessage),
    Job(J),
}

/// How a call ended.
struct Called {
    key: Option<u64>,
    offset: i64,
    panicked: bool,
    /// Its message went to a retry tier or a dead-letter topic.
    failed: bool,
    /// Its offset is done once this ends ([`Action::After`]).
    after: Option<After>,
}

/// A record written apart from the pipeline's producer (a route's parked
/// message), whose acknowledgement completes its offset. The task awaits
/// these beside its calls, in one `FuturesUnordered`: no task is spawned
/// for each, and the acknowledgements of a produce request wake the task
/// once, not once each.
struct After {
    written: Pin<Box<dyn Future<Output = Written> + Send>>,
    done: Option<Completion>,
}

impl Future for After {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let written = futures::ready!(self.written.as_mut().poll(cx));
        // Given up, the offset is never completed ([`Action::GiveUp`]).
        if let (Some(done), Written::Acknowledged) = (self.done.take(), written) {
            done.complete();
        }
        Poll::Ready(())
    }
}

/// Runs a partition until the loop closes it. `previous` is the task of the
/// partition's previous ownership, if it has not ended: nothing starts
/// before it has, so no two calls of one partition overlap across a
/// rebalance, and this task's end implies its predecessor's.
pub(super) async fn run<P: Processor>(
    partition: Partition<P>,
    mut slice: Slice,
    queue: PartitionQueue,
    mut control: mpsc::UnboundedReceiver<Control>,
    previous: Option<JoinHandle<()>>,
) {
    let mut queue = queue;
    if let Some(previous) = previous {
        let _ = previous.await;
        // The predecessor's queue, dropped as it ended, was a handle of the
        // same librdkafka queue, and dropping it turned off this one's
        // wake-ups: split again, now that it is gone.
        drop(queue);
        let tp = &partition.tp;
        match partition
            .shared
            .consumer
            .split_partition_queue(&tp.topic, tp.partition)
        {
            Some(again) => queue = again,
            None => {
                partition.shared.halt.fail(format!(
                    "librdkafka has no queue for the assigned partition {}[{}]",
                    tp.topic, tp.partition
                ));
                return;
            }
        }
    }
    let mut messages = queue.stream();
    let processor = &partition.shared.processor;
    // Nothing is read before the processor is ready for the partition (a
    // route's park table has read what the partition's last owner wrote);
    // a close meanwhile ends the task.
    let watch = processor.watch(&partition.tp);
    tokio::pin!(watch);
    let wake = loop {
        tokio::select! {
            biased;
            order = control.recv() => match order {
                Some(Control::Close) | None => {
                    processor.unwatch(&partition.tp);
                    return;
                }
                Some(_) => {}
            },
            wake = &mut watch => break wake,
        }
    };
    let max = match partition.concurrency.ordering {
        MessageOrder::Partition => 1,
        _ => partition.concurrency.max_in_flight.max(1),
    };
    let lookahead = lookahead(max);
    let mut waiting: KeyQueue<Item<P::Job>> = KeyQueue::default();
    let mut waiting_bytes = 0usize;
    let mut calls = InFlight::new();
    let mut afters: FuturesUnordered<After> = FuturesUnordered::new();
    // The box of a call that ended in its first poll, for the next call.
    let mut spare = None;
    let (mut held, mut closed) = (false, false);
    let mut fallback = fallback_timer();
    loop {
        while calls.len() < max {
            slice.yield_if_spent().await;
            let Some((key, item)) = waiting.take() else {
                break;
            };
            if let Item::Message(message) = &item {
                waiting_bytes -= size_of(message);
            }
            let next = call(&partition, key, item);
            let mut next = match spare.take() {
                Some(mut boxed) => {
                    Pin::set(&mut boxed, next);
                    boxed
                }
                None => Box::pin(next),
            };
            // A call that waits on no host call (a handler doing only its
            // own work) ends in its first poll. Polled here, it costs no
            // allocation and no trip through `calls`, and its box serves
            // the next call; one that waits goes into `calls`.
            match futures::poll!(next.as_mut()) {
                Poll::Ready(called) => {
                    ended(&partition, &mut waiting, &mut afters, &mut slice, called);
                    spare = Some(next);
                }
                Poll::Pending => calls.push(next),
            }
        }
        if closed && calls.is_empty() && afters.is_empty() {
            processor.unwatch(&partition.tp);
            break;
        }
        let full = processor.full(&partition.tp);
        let reading = !held
            && !closed
            && !full
            && calls.len() < max
            && waiting.len() < lookahead
            && waiting_bytes < LOOKAHEAD_BYTES;
        tokio::select! {
            biased;
            order = control.recv(), if !closed => match order {
                Some(Control::Flush) => {
                    // librdkafka drops outdated messages as a poll meets
                    // them; one poll of a paused partition finds nothing
                    // else. Should it find a message anyway, it is read as
                    // any other: one not due is reported as held again, and
                    // the task stays held until the loop releases it.
                    while let Poll::Ready(Some(next)) = futures::poll!(messages.next()) {
                        if read(&partition, next, &mut waiting, &mut waiting_bytes) {
                            break;
                        }
                    }
                }
                Some(Control::Release) => held = false,
                Some(Control::Close) | None => {
                    closed = true;
                    waiting.clear();
                    waiting_bytes = 0;
                    // Whoever reads it next reports it, if it is still stuck.
                    if partition.stuck.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        let health = partition.shared.telemetry.health();
                        health.decoded(partition.shared.processor.name(), &partition.tp);
                    }
                }
            },
            Some(called) = calls.next(), if !calls.is_empty() => {
                ended(&partition, &mut waiting, &mut afters, &mut slice, called);
            }
            // Every acknowledgement that came in, at once.
            Some(()) = afters.next(), if !afters.is_empty() => {
                while let Poll::Ready(Some(())) = futures::poll!(afters.next()) {}
            }
            // Full: read again once there is room.
            _ = processor.room(), if full && !closed => {}
            _ = woken(wake.as_deref()), if wake.is_some() && !closed => {
                for (key, job) in processor.jobs(&partition.tp) {
                    let key = key_of(partition.concurrency.ordering, Some(&key), &partition.keys);
                    waiting.push(key, Item::Job(job));
                }
            }
            // `None`: the fallback ticked; the loop comes round and reads
            // again. (A `Some(..)` pattern here would turn the branch off
            // for the rest of this select, and a task with no call running
            // would wait for ever.)
            next = next_or_fallback(&mut messages, &mut fallback), if reading => {
                let Some(next) = next else { continue };
                held = read(&partition, next, &mut waiting, &mut waiting_bytes);
                // What else the queue holds already, within the same
                // bounds, comes in without a trip through this select
                // per message.
                while !held && waiting.len() < lookahead && waiting_bytes < LOOKAHEAD_BYTES {
                    // Polled with this task's waker: a queue found empty
                    // wakes this task, as a read through the select would.
                    let Poll::Ready(Some(next)) = futures::poll!(messages.next()) else {
                        break;
                    };
                    held = read(&partition, next, &mut waiting, &mut waiting_bytes);
                }
            }
        }
    }
}

/// Takes a message read from the partition's queue into the waiting. A tier
/// message that is not due yet is reported to the loop instead, which
/// rewinds to it: then `true`, and the task reads nothing more until the
/// loop releases it.
fn read<P: Processor>(
    partition: &Partition<P>,
    next: KafkaResult<BorrowedMessage<'_>>,
    waiting: &mut KeyQueue<Item<P::Job>>,
    waiting_bytes: &mut usize,
) -> bool {
    let message = match next {
        Ok(message) => message,
        Err(e) => {
            let pipeline = partition.shared.processor.name();
            if crate::dlq::is_undecodable(&e) {
                // librdkafka fetches the batch again and again: the
                // partition is stuck until an operator skips it.
                partition
                    .stuck
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let at = partition.tracker.lock().unwrap().position();
                let health = partition.shared.telemetry.health();
                health.undecodable(pipeline, &partition.tp, at, &e.to_string());
            } else {
                tracing::warn!(
                    pipeline,
                    topic = partition.tp.topic,
                    partition = partition.tp.partition,
                    error = %e,
                    "Consumer error."
                );
            }
            return false;
        }
    };
    // A load first: no read-modify-write on every message's path.
    if partition.stuck.load(std::sync::atomic::Ordering::Relaxed)
        && partition
            .stuck
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    {
        let health = partition.shared.telemetry.health();
        health.decoded(partition.shared.processor.name(), &partition.tp);
    }
    let offset = message.offset();
    if let Some(due_ms) = partition.shared.processor.due_at(&message)
        && due_ms > now_ms()
    {
        let tp = (*partition.tp).clone();
        let _ = partition.held.send(Held { tp, offset, due_ms });
        return true;
    }
    let key = key_of(
        partition.concurrency.ordering,
        message.key(),
        &partition.keys,
    );
    let message = message.detach();
    partition.tracker.lock().unwrap().begin(offset);
    *waiting_bytes += size_of(&message);
    waiting.push(key, Item::Message(message));
    false
}

/// What follows a call's end: its key is free for the next message of
/// that key, or, if it panicked, the route halts. The task's slice notes
/// whether it failed.
fn ended<P: Processor>(
    partition: &Partition<P>,
    waiting: &mut KeyQueue<Item<P::Job>>,
    afters: &mut FuturesUnordered<After>,
    slice: &mut Slice,
    called: Called,
) {
    slice.record(called.failed);
    if let Some(after) = called.after {
        afters.push(after);
    }
    if called.panicked {
        let tp = &partition.tp;
        partition.shared.halt.fail(format!(
            "processing {}[{}]@{} panicked; nothing from that offset on is committed",
            tp.topic, tp.partition, called.offset
        ));
    } else if let Some(key) = called.key {
        waiting.done(key);
    }
}

/// Waits for `wake` (never, without one).
async fn woken(wake: Option<&tokio::sync::Notify>) {
    match wake {
        Some(wake) => wake.notified().await,
        None => std::future::pending().await,
    }
}

/// The timer of [`next_or_fallback`]: its first tick one period from now.
fn fallback_timer() -> tokio::time::Interval {
    let mut timer =
        tokio::time::interval_at(tokio::time::Instant::now() + WAKE_FALLBACK, WAKE_FALLBACK);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    timer
}

/// The next item of `messages`, or `None` when `fallback` ticks first (the
/// caller then asks again, which polls the queue again): a wake-up that
/// librdkafka never gives costs one [`WAKE_FALLBACK`], not a stalled
/// partition.
async fn next_or_fallback<S: Stream + Unpin>(
    messages: &mut S,
    fallback: &mut tokio::time::Interval,
) -> Option<S::Item> {
    tokio::select! {
        biased;
        next = messages.next() => next,
        _ = fallback.tick() => None,
    }
}

/// The bytes a waiting message holds: its key and payload.
fn size_of(message: &OwnedMessage) -> usize {
    message.key().map_or(0, <[u8]>::len) + message.payload().map_or(0, <[u8]>::len)
}

/// One call: processes `message` and hands its hops to the producer (or the
/// scheduler). Its offset is done when they are acknowledged. A call that
/// panics is reported, and its offset never completes, so nothing past it is
/// committed. A job runs in its key's turn, and completes no offset.
///
/// It borrows the route's state and the scheduler's sender from its task:
/// a clone of either per message moved their shared counters' cache lines
/// between cores.
async fn call<P: Processor>(
    partition: &Partition<P>,
    key: Option<u64>,
    item: Item<P::Job>,
) -> Called {
    let shared = &partition.shared;
    let message = match item {
        Item::Message(message) => message,
        Item::Job(job) => {
            let run = AssertUnwindSafe(shared.processor.run_job(job)).catch_unwind();
            return Called {
                key,
                offset: -1,
                panicked: run.await.is_err(),
                failed: false,
                after: None,
            };
        }
    };
    let offset = message.offset();
    let done = Completion::new(offset, partition.tracker.clone());
    // Each await point keeps its own state in this future, which every
    // message allocates and moves: so the sends share one.
    let work = async {
        let sends = match shared.processor.process(&message).await {
            Action::Done => {
                done.complete();
                return (false, None);
            }
            // Dropped uncompleted: nothing at or past it is committed.
            Action::GiveUp => return (false, None),
            Action::Hops(hops) if hops.is_empty() => {
                done.complete();
                return (false, None);
            }
            Action::HopAt { at_ms, hop } => {
                // The scheduler lives until shutdown; if it is gone, the
                // offset simply stays uncommitted.
                let _ = partition.scheduler.send(Scheduled { at_ms, hop, done });
                return (false, None);
            }
            // Awaited by the task, which ends only once it has ended (or
            // is aborted at the drain's deadline, leaving the offset
            // uncommitted).
            Action::After { written, failed } => {
                let after = After {
                    written,
                    done: Some(done),
                };
                return (failed, Some(after));
            }
            Action::Hop(hop) => vec![(hop, done)],
            Action::Hops(hops) => {
                let dones = done.split(hops.len());
                hops.into_iter().zip(dones).collect()
            }
        };
        let failed = sends.iter().any(|(hop, _)| hop.outcome.is_failure());
        for (hop, done) in sends {
            shared.producer.send(hop, done).await;
        }
        (failed, None)
    };
    let (panicked, failed, after) = match AssertUnwindSafe(work).catch_unwind().await {
        Ok((failed, after)) => (false, failed, after),
        Err(_) => (true, false, None),
    };
    Called {
        key,
        offset,
        panicked,
        failed,
        after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A stream whose first item is ready from its second poll on, and
    /// which never wakes its reader: a lost wake-up.
    struct NeverWakes {
        polls: usize,
    }

    impl Stream for NeverWakes {
        type Item = u32;

        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<u32>> {
            self.polls += 1;
            match self.polls {
                1 => Poll::Pending,
                _ => Poll::Ready(Some(7)),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_wake_up_costs_one_fallback_period_not_a_stall() {
        let mut plain = NeverWakes { polls: 0 };
        let read = tokio::spawn(async move { plain.next().await });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !read.is_finished(),
            "without the fallback, a lost wake-up stalls the read"
        );
        read.abort();

        let mut messages = NeverWakes { polls: 0 };
        let mut fallback = fallback_timer();
        let start = tokio::time::Instant::now();
        let mut got = None;
        let mut asked = 0;
        while got.is_none() {
            got = next_or_fallback(&mut messages, &mut fallback).await;
            asked += 1;
        }
        assert_eq!(got, Some(7));
        assert_eq!(
            asked, 1,
            "the tick wakes the read, which polls the stream again"
        );
        assert_eq!(start.elapsed(), WAKE_FALLBACK);
    }

    #[test]
    fn a_task_reads_ahead_enough_for_free_keys_and_no_more() {
        assert_eq!(lookahead(1), 256);
        assert_eq!(lookahead(16), 256);
        assert_eq!(lookahead(256), 1024);
        assert_eq!(lookahead(usize::MAX), usize::MAX);
    }
}
