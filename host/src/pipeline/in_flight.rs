//! The calls a partition's task has in flight.
//!
//! Many calls run in a `FuturesUnordered`, but one call alone is polled
//! directly. After a poll in which it polled every future it holds and
//! found them all pending, `FuturesUnordered` wakes its own task again, to
//! yield. With one call in flight that is every poll: a call that waits
//! twice (for a response's head, then for its body) woke the partition's
//! task once for nothing, and tokio runs a task that woke itself as a
//! yield, at the back of its queue, waking the runtime's other worker to
//! take it. One call is what a partition with `ordering = "partition"`
//! always has, and what any partition has while its traffic is light.

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

/// InFlight in flight: one polled directly, or several in a
/// `FuturesUnordered`.
pub(super) struct InFlight<F> {
    solo: Option<F>,
    many: FuturesUnordered<F>,
}

impl<F: Future + Unpin> InFlight<F> {
    pub(super) fn new() -> Self {
        InFlight {
            solo: None,
            many: FuturesUnordered::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.solo.is_some()) + self.many.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a call. A second call moves the first into the set beside it;
    /// the set polls each future it takes in before it waits, so the first
    /// one's wake-ups reach it from then on.
    pub(super) fn push(&mut self, call: F) {
        if self.many.is_empty() && self.solo.is_none() {
            self.solo = Some(call);
            return;
        }
        if let Some(solo) = self.solo.take() {
            self.many.push(solo);
        }
        self.many.push(call);
    }

    /// The output of the next call to end; `None` when none is in flight.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if let Some(solo) = &mut self.solo {
            let output = ready!(Pin::new(solo).poll(cx));
            self.solo = None;
            return Poll::Ready(Some(output));
        }
        self.many.poll_next_unpin(cx)
    }

    /// [`InFlight::poll_next`] as a future.
    pub(super) fn next(&mut self) -> impl Future<Output = Option<F::Output>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use tokio::sync::oneshot;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<Counting>, Waker) {
        let counting = Arc::new(Counting::default());
        (counting.clone(), Waker::from(counting))
    }

    type Call = Pin<Box<dyn Future<Output = u32> + Send>>;

    /// A call that ends with `value` once its sender sends.
    fn call(value: u32) -> (oneshot::Sender<()>, Call) {
        let (tx, rx) = oneshot::channel();
        let call: Call = Box::pin(async move {
            let _ = rx.await;
            value
        });
        (tx, call)
    }

    #[test]
    fn one_pending_call_does_not_wake_its_task() {
        // What the task would see with the set alone: a wake-up after
        // every poll that finds the one call pending.
        let (counted, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut set = FuturesUnordered::new();
        let (_tx, pending) = call(1);
        set.push(pending);
        assert!(set.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(counted.0.load(Ordering::SeqCst), 1, "the set yields");

        let (counted, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut calls = InFlight::new();
        let (tx, pending) = call(7);
        calls.push(pending);
        assert!(calls.poll_next(&mut cx).is_pending());
        assert!(calls.poll_next(&mut cx).is_pending());
        assert_eq!(
            counted.0.load(Ordering::SeqCst),
            0,
            "no wake-up for nothing"
        );
        // The call's own wake-up still comes, and its output after it.
        tx.send(()).unwrap();
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
        assert_eq!(calls.poll_next(&mut cx), Poll::Ready(Some(7)));
        assert!(calls.is_empty());
        assert_eq!(calls.poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn a_second_call_takes_the_first_into_the_set_without_losing_its_wake_up() {
        let (counted, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut calls = InFlight::new();
        let (first_tx, first) = call(1);
        let (second_tx, second) = call(2);
        calls.push(first);
        assert!(calls.poll_next(&mut cx).is_pending());
        calls.push(second);
        assert_eq!(calls.len(), 2);
        // The set polls both before it waits, so the first registers its
        // wake-up with the set.
        assert!(calls.poll_next(&mut cx).is_pending());
        let before = counted.0.load(Ordering::SeqCst);
        first_tx.send(()).unwrap();
        assert!(
            counted.0.load(Ordering::SeqCst) > before,
            "the first wakes the task"
        );
        assert_eq!(calls.poll_next(&mut cx), Poll::Ready(Some(1)));
        second_tx.send(()).unwrap();
        assert_eq!(calls.poll_next(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(calls.len(), 0);
        // With the set empty, the next call is polled directly again.
        let (third_tx, third) = call(3);
        calls.push(third);
        assert!(calls.solo.is_some());
        third_tx.send(()).unwrap();
        assert_eq!(calls.poll_next(&mut cx), Poll::Ready(Some(3)));
    }

    #[test]
    fn calls_that_end_out_of_order_all_come_out() {
        let (_, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut calls = InFlight::new();
        let mut senders = Vec::new();
        for value in 0..5 {
            let (tx, c) = call(value);
            calls.push(c);
            senders.push(tx);
        }
        assert!(calls.poll_next(&mut cx).is_pending());
        let mut out = Vec::new();
        for tx in senders.into_iter().rev() {
            tx.send(()).unwrap();
            match calls.poll_next(&mut cx) {
                Poll::Ready(Some(value)) => out.push(value),
                other => panic!("a call whose sender sent is ready: {other:?}"),
            }
        }
        assert_eq!(out, vec![4, 3, 2, 1, 0]);
        assert!(calls.is_empty());
    }
}
