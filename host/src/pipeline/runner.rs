//! A partition's queue and the runners that work it off.
//!
//! The loop pushes each received message onto its partition's [`Queue`];
//! up to `max_in_flight` runner tasks take messages from it in the order
//! the [`KeyGate`] allows and call them. A runner goes from one message to
//! the next without the loop, and asks the loop for company when more wait.

use super::Shared;
use super::gate::KeyGate;
use crate::hold::TopicPartition;
use crate::hop::{Action, Completion, Processor};
use crate::offsets::OffsetTracker;
use crate::scheduler::Scheduled;
use futures::FutureExt as _;
use rdkafka::message::{Message, OwnedMessage};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

use super::{MAX_QUEUE_BYTES, RUNNER_IDLE};

/// A partition's received, not yet started messages, shared by the loop
/// (which adds them) and the partition's runners (which take them), under a
/// `std` mutex: nothing awaits while holding it.
#[derive(Default)]
pub(super) struct Queue {
    gate: KeyGate<OwnedMessage>,
    /// Runners working on the partition.
    pub running: usize,
    /// Revoked or stopping: runners take nothing more.
    pub closed: bool,
    /// Paused at the broker because the queue reached its size.
    pub full: bool,
    /// A runner asked the loop for more runners, not yet started.
    pub more_asked: bool,
    /// Key and payload bytes waiting.
    pub bytes: usize,
    /// Runners waiting for a message to come free (counted in `running`).
    pub parked: usize,
}

impl Queue {
    /// Queues `message` after the others; `key` as [`super::gate::key_of`]
    /// gives it.
    pub fn push(&mut self, key: Option<u64>, message: OwnedMessage) {
        self.bytes += size_of(&message);
        self.gate.push(key, message);
    }

    /// The oldest waiting message its key lets start now, with that key,
    /// busy until [`Queue::done`].
    fn take(&mut self) -> Option<(Option<u64>, OwnedMessage)> {
        let (key, message) = self.gate.take()?;
        self.bytes -= size_of(&message);
        Some((key, message))
    }

    /// The call of `key` ended.
    fn done(&mut self, key: u64) {
        self.gate.done(key);
    }

    /// Drops the waiting messages (they are fetched again by the
    /// partition's next owner, or the next start).
    pub fn clear(&mut self) {
        self.gate.clear();
        self.bytes = 0;
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.gate.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gate.is_empty()
    }
}

/// The bytes a queued message holds: its key and payload.
pub(super) fn size_of(message: &OwnedMessage) -> usize {
    message.key().map_or(0, <[u8]>::len) + message.payload().map_or(0, <[u8]>::len)
}

/// What a partition's runners work with.
pub(super) struct Lane<P> {
    pub shared: Arc<Shared<P>>,
    pub tp: Arc<TopicPartition>,
    pub tracker: Arc<Mutex<OffsetTracker>>,
    pub queue: Arc<Mutex<Queue>>,
    /// Runners at once, at most: `max_in_flight`, 1 under `partition`.
    pub max: usize,
    /// A full (paused) queue is resumed once it is down to this length:
    /// three quarters of its size.
    pub resume_at: usize,
    /// Wakes a parked runner.
    pub wake: tokio::sync::Notify,
    pub scheduler: mpsc::UnboundedSender<Scheduled>,
    pub notices: mpsc::UnboundedSender<Notice>,
}

/// What runners tell the loop.
pub(super) enum Notice {
    /// A full partition's queue is down to [`Lane::resume_at`] messages and
    /// three quarters of its bytes: resume it.
    Drained(Arc<TopicPartition>),
    /// The last runner of a closed (revoked) queue ended.
    Idle(Arc<TopicPartition>),
    /// More messages wait than runners run, with room for more.
    More(Arc<TopicPartition>),
}

/// A runner of one partition: takes the next message its ordering allows
/// and calls it, until none is left (or the queue is closed). While it has a
/// message and more wait, it asks the loop for more runners, up to the
/// lane's `max`. A call that panics halts the pipeline: its offset never
/// completes, so nothing past it is committed.
pub(super) async fn run_lane<P: Processor>(lane: Arc<Lane<P>>) {
    /// What a runner does next, decided under the queue's lock.
    enum Step {
        Run(Option<u64>, OwnedMessage),
        Park,
        Exit,
    }
    let mut done_key: Option<u64> = None;
    loop {
        let step = {
            let mut queue = lane.queue.lock().unwrap();
            if let Some(k) = done_key.take() {
                queue.done(k);
            }
            let next = match queue.closed {
                true => None,
                false => queue.take(),
            };
            match next {
                None if queue.closed => {
                    queue.running -= 1;
                    if queue.running == 0 {
                        let _ = lane.notices.send(Notice::Idle(lane.tp.clone()));
                    }
                    Step::Exit
                }
                None => {
                    queue.parked += 1;
                    Step::Park
                }
                Some((key, message)) => {
                    if !queue.is_empty() {
                        if queue.parked > 0 {
                            lane.wake.notify_one();
                        } else if queue.running < lane.max && !queue.more_asked {
                            queue.more_asked = true;
                            let _ = lane.notices.send(Notice::More(lane.tp.clone()));
                        }
                    }
                    if queue.full
                        && queue.len() <= lane.resume_at
                        && queue.bytes <= MAX_QUEUE_BYTES / 4 * 3
                    {
                        queue.full = false;
                        let _ = lane.notices.send(Notice::Drained(lane.tp.clone()));
                    }
                    Step::Run(key, message)
                }
            }
        };
        let (key, message) = match step {
            Step::Exit => return,
            Step::Park => {
                // Wait for a message (or a key) to come free: the loop wakes
                // a parked runner before it starts a new one.
                let woken = tokio::time::timeout(RUNNER_IDLE, lane.wake.notified())
                    .await
                    .is_ok();
                let mut queue = lane.queue.lock().unwrap();
                queue.parked -= 1;
                if !woken && queue.is_empty() {
                    queue.running -= 1;
                    if queue.closed && queue.running == 0 {
                        let _ = lane.notices.send(Notice::Idle(lane.tp.clone()));
                    }
                    return;
                }
                continue;
            }
            Step::Run(key, message) => (key, message),
        };
        let offset = message.offset();
        let done = Completion::new(offset, lane.tracker.clone());
        let call = call(lane.shared.clone(), message, done, lane.scheduler.clone());
        if AssertUnwindSafe(call).catch_unwind().await.is_err() {
            let (topic, partition) = (&lane.tp.topic, lane.tp.partition);
            lane.shared.halt.fail(format!(
                "processing {topic}[{partition}]@{offset} panicked; nothing from that offset on is committed"
            ));
            let mut queue = lane.queue.lock().unwrap();
            queue.running -= 1;
            if queue.closed && queue.running == 0 {
                let _ = lane.notices.send(Notice::Idle(lane.tp.clone()));
            }
            return;
        }
        done_key = key;
    }
}

/// One call: processes `message` and hands its hops to the producer (or the
/// scheduler). Its offset is done when they are acknowledged.
async fn call<P: Processor>(
    shared: Arc<Shared<P>>,
    message: OwnedMessage,
    done: Completion,
    scheduler: mpsc::UnboundedSender<Scheduled>,
) {
    match shared.processor.process(&message).await {
        Action::Done => done.complete(),
        Action::Hop(hop) => shared.producer.send(hop.record, done, hop.event).await,
        Action::Hops(hops) if hops.is_empty() => done.complete(),
        Action::Hops(hops) => {
            let dones = done.split(hops.len());
            for (hop, done) in hops.into_iter().zip(dones) {
                shared.producer.send(hop.record, done, hop.event).await;
            }
        }
        Action::HopAt { at_ms, hop } => {
            // The scheduler lives until shutdown; if it is gone, the offset
            // simply stays uncommitted.
            let _ = scheduler.send(Scheduled { at_ms, hop, done });
        }
    }
}
