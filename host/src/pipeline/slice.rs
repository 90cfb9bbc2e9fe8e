//! A partition's task gives up its worker after [`SLICE`] of running.
//!
//! A busy partition's task may never wait: its queue always holds the next
//! message, and a handler that calls no host import ends its call in the
//! poll that starts it. Such a task keeps its worker thread for as long as
//! its queue lasts, and the tasks queued behind it on that worker wait,
//! even while the runtime's other worker has nothing to do: three
//! partitions of a CPU-bound handler on two workers used one to one and a
//! half of the two cores. tokio's own budget would not end that (the task
//! touches no tokio resource per message), and a budget counted in
//! messages would not be fair either: a task of cheap messages would get
//! a hundredth of the time of one whose messages each cost a hop.
//!
//! So the task runs in slices of time. [`Sliced`] notes when each poll of
//! the task began, and the task asks [`spent`] before each call it starts:
//! once a slice has passed, it yields, and goes to the back of its worker's
//! queue, where an idle worker can take it. The check is one read of the
//! clock per call; a yield costs about a microsecond per slice.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a task runs before it yields.
pub(super) const SLICE: Duration = Duration::from_millis(1);

thread_local! {
    /// When the poll of the [`Sliced`] task running on this thread began.
    static POLLED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// A task's future, noting when each of its polls begins.
pub(super) struct Sliced<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Sliced<F> {
    pub(super) fn new(inner: F) -> Self {
        Sliced {
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for Sliced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let outer = POLLED_AT.replace(Some(Instant::now()));
        let polled = self.inner.as_mut().poll(cx);
        POLLED_AT.set(outer);
        polled
    }
}

/// Whether the poll of the [`Sliced`] task running here began [`SLICE`] or
/// more ago. Outside such a poll, never.
pub(super) fn spent() -> bool {
    POLLED_AT.get().is_some_and(|at| at.elapsed() >= SLICE)
}

/// Yields if the task's slice is spent.
pub(super) async fn yield_if_spent() {
    if spent() {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Keeps the CPU busy for `d`, as a handler doing its own work does.
    fn busy(d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_slice_is_spent_only_inside_a_sliced_poll_that_ran_long_enough() {
        assert!(!spent(), "outside a sliced poll");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (fresh, late, next) = runtime.block_on(Sliced::new(async {
            let fresh = spent();
            busy(SLICE);
            let late = spent();
            tokio::task::yield_now().await;
            (fresh, late, spent())
        }));
        assert!(!fresh, "a poll that just began");
        assert!(late, "a poll that ran a whole slice");
        assert!(!next, "the poll after a yield begins a new slice");
        assert!(!spent(), "after the task, outside it");
    }

    /// Two tasks on one worker: one with 200 calls of a quarter slice ready,
    /// which never waits, and one that only sets a flag. The busy task
    /// yields once a slice is spent, so the other runs long before the busy
    /// one ends; without the yield, it ran only after (checked first, so
    /// the test would see it).
    #[test]
    fn a_busy_task_lets_the_others_on_its_worker_run() {
        fn race(yields: bool) -> usize {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let other_ran = Arc::new(AtomicBool::new(false));
                let seen = other_ran.clone();
                let busy_task = tokio::spawn(Sliced::new(async move {
                    for call in 0..200 {
                        if seen.load(Ordering::SeqCst) {
                            return call;
                        }
                        if yields {
                            yield_if_spent().await;
                        }
                        busy(SLICE / 4);
                    }
                    200
                }));
                let flag = other_ran.clone();
                tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
                busy_task.await.unwrap()
            })
        }
        assert_eq!(race(false), 200, "without yielding, the other task waits");
        let calls = race(true);
        assert!(
            calls <= 8,
            "the other task ran after {calls} calls of a quarter slice each"
        );
    }
}
