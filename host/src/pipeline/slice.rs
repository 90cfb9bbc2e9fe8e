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
//! the task began, in the [`Slice`] it shares with the task, and the task
//! asks [`Slice::yield_if_spent`] before each call it starts:
//! once a slice has passed, it yields, and goes to the back of its worker's
//! queue, where an idle worker can take it. The check is one read of the
//! clock per call; a yield costs about a microsecond per slice.
//!
//! Slices share the CPU between tasks, not between routes. A route whose
//! messages all fail costs a hop each, several times an `ok`, and in a
//! retry storm its tasks took four fifths of the two cores from a healthy
//! route beside it. So a task whose recent calls mostly failed
//! ([`Standing`]) defers to the others: once it has run a slice,
//! over however many polls, it sleeps for [`DEFER`] instead of going on,
//! but only while a healthy route's task is kept from the CPU. [`Sliced`]
//! sees that: while some task is failing, it stands between each healthy
//! task and its waker and notes when the task is woken, and a healthy task
//! polled [`STARVED`] or more after its wake-up marks the CPU contended
//! ([`Contention`]) for [`STARVED_FOR`]. While no task is failing, a poll
//! costs one atomic load more.
//! A task is judged from its 64th call on; before, it does neither. With
//! the CPU to spare, a failing route runs at its full rate.

use futures::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How long a task runs before it yields.
pub(super) const SLICE: Duration = Duration::from_millis(1);
/// How long a failing task sleeps after each slice while the CPU is
/// contended: it runs at most one slice in fifty-one. Its hops cost
/// librdkafka's threads several times what they cost the task, so a
/// shorter sleep (10 ms) left it most of the CPU.
pub(super) const DEFER: Duration = Duration::from_millis(50);
/// A healthy task polled this long or longer after its wake-up was kept
/// from the CPU.
pub(super) const STARVED: Duration = Duration::from_millis(1);
/// How long the CPU counts as contended after a healthy task was last kept
/// from it. While failing tasks defer, healthy ones are not kept from it,
/// so this is also how long they defer after the last sign: at 100 ms they
/// came back at full rate several times a second (BENCHMARKS.md).
pub(super) const STARVED_FOR: Duration = Duration::from_secs(1);
/// Of a task's last 64 calls, how many must have failed for it to defer.
const FAILING_OF_64: u32 = 48;

/// The process's tasks, whose CPU they share.
static CONTENTION: LazyLock<Contention> = LazyLock::new(Contention::default);

impl<F> Drop for Sliced<F> {
    fn drop(&mut self) {
        if self.failing == Some(true) {
            self.contention.failing.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// When a healthy task was last kept from the CPU, and how many tasks are
/// failing.
#[derive(Debug)]
pub(super) struct Contention {
    /// The instant times are counted from.
    epoch: Instant,
    /// Microseconds since `epoch` plus one; zero: never.
    starved_at: AtomicU64,
    /// Tasks failing now. While there are none, healthy tasks do not watch
    /// their wake-ups, and a task's poll costs one load of this more.
    failing: AtomicUsize,
}

impl Default for Contention {
    fn default() -> Self {
        Contention {
            epoch: Instant::now(),
            starved_at: AtomicU64::new(0),
            failing: AtomicUsize::new(0),
        }
    }
}

/// `at` as an instant kept in an atomic: microseconds since `epoch`, plus
/// one, so that zero can mean none.
fn stamp(epoch: Instant, at: Instant) -> u64 {
    let micros = at.saturating_duration_since(epoch).as_micros();
    u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1
}

/// The instant a [`stamp`] keeps; `None` for zero.
fn stamped(epoch: Instant, stamp: u64) -> Option<Instant> {
    stamp
        .checked_sub(1)
        .map(|micros| epoch + Duration::from_micros(micros))
}

impl Contention {
    /// Notes that a healthy task was kept from the CPU until `at`.
    fn starved(&self, at: Instant) {
        self.starved_at
            .fetch_max(stamp(self.epoch, at), Ordering::Relaxed);
    }

    /// Whether a healthy task was kept from the CPU within
    /// [`STARVED_FOR`] before `now`.
    fn contended(&self, now: Instant) -> bool {
        stamped(self.epoch, self.starved_at.load(Ordering::Relaxed))
            .is_some_and(|at| now.saturating_duration_since(at) < STARVED_FOR)
    }
}

/// How a task's recent calls ended: the last 64, one bit each, set for a
/// call that failed (its message went to a retry tier or a dead-letter
/// topic).
#[derive(Debug, Default, Clone, Copy)]
struct Standing {
    failed: u64,
    calls: u32,
}

impl Standing {
    /// Notes how a call ended.
    fn record(&mut self, failed: bool) {
        self.failed = self.failed << 1 | u64::from(failed);
        self.calls = self.calls.saturating_add(1);
    }

    /// Whether at least 48 of the last 64 calls failed.
    #[cfg(test)]
    fn failing(&self) -> bool {
        self.judged() == Some(true)
    }

    /// `None` before the 64th call: a task with no record neither defers
    /// nor marks the CPU contended (a failing route's task would mark it
    /// before its record showed, and defer to itself). Then whether the
    /// task is failing.
    fn judged(&self) -> Option<bool> {
        (self.calls >= 64).then(|| self.failed.count_ones() >= FAILING_OF_64)
    }
}

/// What a task and its [`Sliced`] share, one task's: when the poll now
/// running began and how long the task ran before it, which [`Sliced`]
/// writes around each poll, and whether the task is failing and has just
/// deferred, which the task writes ([`Slice`]). Only the thread polling the
/// task touches it, so every access is relaxed.
struct Clock {
    contention: &'static Contention,
    /// When the poll now running began: nanoseconds since the
    /// contention's epoch, plus one; zero outside a poll.
    polled_at: AtomicU64,
    /// How long the task ran in its polls before this one, since it last
    /// deferred, in nanoseconds.
    ran_before: AtomicU64,
    /// How the task's recent calls ended, as it last said:
    /// [`Standing::judged`], encoded by [`judged_to_u8`].
    failing: AtomicU8,
    /// Set when the task defers: its running time starts again from zero.
    deferred: AtomicBool,
}

/// `None`, healthy and failing as 0, 1 and 2, for [`Clock::failing`].
fn judged_to_u8(judged: Option<bool>) -> u8 {
    match judged {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    }
}

fn judged_from_u8(judged: u8) -> Option<bool> {
    match judged {
        0 => None,
        n => Some(n == 2),
    }
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Clock {
    /// `at` as nanoseconds since the epoch, plus one.
    fn stamp(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.contention.epoch)).saturating_add(1)
    }

    /// How long the poll now running has run at `now`; `None` outside a
    /// poll.
    fn polled_for(&self, now: Instant) -> Option<Duration> {
        match self.polled_at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_nanos(self.stamp(now).saturating_sub(at))),
        }
    }
}

/// A task's side of its [`Sliced`]: asks whether its slice is spent, and
/// keeps its [`Standing`]. The task's future owns it; [`Sliced::new`]
/// hands it over.
pub(super) struct Slice {
    clock: Arc<Clock>,
    standing: Standing,
}

impl Slice {
    /// Notes how a call ended, and tells the task's [`Sliced`] whether the
    /// task is now failing.
    pub(super) fn record(&mut self, failed: bool) {
        self.standing.record(failed);
        let judged = judged_to_u8(self.standing.judged());
        self.clock.failing.store(judged, Ordering::Relaxed);
    }

    /// Whether the poll of this task began [`SLICE`] or more ago. Outside
    /// a poll, never.
    pub(super) fn spent(&self) -> bool {
        self.clock
            .polled_for(Instant::now())
            .is_some_and(|ran| ran >= SLICE)
    }

    /// How long the task has run, over all its polls, since it last
    /// deferred.
    fn ran(&self) -> Duration {
        Duration::from_nanos(self.clock.ran_before.load(Ordering::Relaxed))
            + self
                .clock
                .polled_for(Instant::now())
                .unwrap_or(Duration::ZERO)
    }

    /// Yields if the task's slice is spent. A failing task that has run a
    /// slice, over however many polls, sleeps for [`DEFER`] instead while
    /// the CPU is contended.
    pub(super) async fn yield_if_spent(&self) {
        if self.standing.judged() == Some(true)
            && self.ran() >= SLICE
            && self.clock.contention.contended(Instant::now())
        {
            self.clock.deferred.store(true, Ordering::Relaxed);
            tokio::time::sleep(DEFER).await;
            return;
        }
        if self.spent() {
            tokio::task::yield_now().await;
        }
    }
}

/// The waker [`Sliced`] gives its task: it notes when the task is woken,
/// then wakes it.
struct Alarm {
    task: AtomicWaker,
    /// When the task was first woken since its last poll: microseconds
    /// since `epoch` plus one; zero: not woken.
    woken_at: AtomicU64,
    epoch: Instant,
}

impl Wake for Alarm {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let now = stamp(self.epoch, Instant::now());
        let _ = self
            .woken_at
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.task.wake();
    }
}

impl Alarm {
    /// How long ago, at `now`, the task was woken, if it was since its last
    /// poll; the next call answers for wake-ups after this one.
    fn waited(&self, now: Instant) -> Option<Duration> {
        stamped(self.epoch, self.woken_at.swap(0, Ordering::Relaxed))
            .map(|at| now.saturating_duration_since(at))
    }
}

/// A task's future, noting when each of its polls begins, how long it has
/// run since it last deferred, and, for a healthy task while some task is
/// failing, how long it waited for the CPU after each wake-up.
pub(super) struct Sliced<F> {
    inner: Pin<Box<F>>,
    ran: Duration,
    failing: Option<bool>,
    /// Whether the last poll gave the task [`Alarm`]'s waker.
    watched: bool,
    alarm: Arc<Alarm>,
    waker: Waker,
    contention: &'static Contention,
    /// Shared with the task's [`Slice`].
    clock: Arc<Clock>,
}

impl<F: Future> Sliced<F> {
    /// The task `task` makes, given its [`Slice`].
    pub(super) fn new(task: impl FnOnce(Slice) -> F) -> Self {
        Sliced::sharing(task, &CONTENTION)
    }

    /// A task that reports to, and defers by, `contention`.
    fn sharing(task: impl FnOnce(Slice) -> F, contention: &'static Contention) -> Self {
        let alarm = Arc::new(Alarm {
            task: AtomicWaker::new(),
            woken_at: AtomicU64::new(0),
            epoch: contention.epoch,
        });
        let clock = Arc::new(Clock {
            contention,
            polled_at: AtomicU64::new(0),
            ran_before: AtomicU64::new(0),
            failing: AtomicU8::new(judged_to_u8(None)),
            deferred: AtomicBool::new(false),
        });
        let slice = Slice {
            clock: clock.clone(),
            standing: Standing::default(),
        };
        Sliced {
            inner: Box::pin(task(slice)),
            ran: Duration::ZERO,
            failing: None,
            watched: false,
            waker: Waker::from(alarm.clone()),
            alarm,
            contention,
            clock,
        }
    }
}

impl<F: Future> Future for Sliced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let began = Instant::now();
        let watch =
            self.failing == Some(false) && self.contention.failing.load(Ordering::Relaxed) > 0;
        if watch {
            let waited = self.alarm.waited(began);
            // A wake-up before this task watched came through a waker it
            // no longer gives out: it says nothing of now.
            if self.watched && waited.is_some_and(|w| w >= STARVED) {
                self.contention.starved(began);
            }
            self.alarm.task.register(cx.waker());
        }
        self.watched = watch;
        let clock = &self.clock;
        clock.polled_at.store(clock.stamp(began), Ordering::Relaxed);
        clock.ran_before.store(nanos(self.ran), Ordering::Relaxed);
        clock.deferred.store(false, Ordering::Relaxed);
        let this = &mut *self;
        let polled = match watch {
            true => this
                .inner
                .as_mut()
                .poll(&mut Context::from_waker(&this.waker)),
            false => this.inner.as_mut().poll(cx),
        };
        self.clock.polled_at.store(0, Ordering::Relaxed);
        self.ran = match self.clock.deferred.load(Ordering::Relaxed) {
            true => Duration::ZERO,
            false => self.ran.saturating_add(began.elapsed()),
        };
        let failing = judged_from_u8(self.clock.failing.load(Ordering::Relaxed));
        let (was, is) = (self.failing == Some(true), failing == Some(true));
        if is && !was {
            self.contention.failing.fetch_add(1, Ordering::Relaxed);
        } else if was && !is {
            self.contention.failing.fetch_sub(1, Ordering::Relaxed);
        }
        self.failing = failing;
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Keeps the CPU busy for `d`, as a handler doing its own work does.
    fn busy(d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_slice_is_spent_only_inside_a_sliced_poll_that_ran_long_enough() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (fresh, late, next) = runtime.block_on(Sliced::new(|slice| async move {
            let fresh = slice.spent();
            busy(SLICE);
            let late = slice.spent();
            tokio::task::yield_now().await;
            (fresh, late, slice.spent())
        }));
        assert!(!fresh, "a poll that just began");
        assert!(late, "a poll that ran a whole slice");
        assert!(!next, "the poll after a yield begins a new slice");
        let outside = Sliced::new(|slice| async move { slice });
        let slice = runtime.block_on(outside);
        busy(SLICE);
        assert!(!slice.spent(), "outside a sliced poll");
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
                let busy_task = tokio::spawn(Sliced::new(move |slice| async move {
                    for call in 0..200 {
                        if seen.load(Ordering::SeqCst) {
                            return call;
                        }
                        if yields {
                            slice.yield_if_spent().await;
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

    #[test]
    fn a_task_is_failing_from_48_failures_in_its_last_64_calls() {
        let mut standing = Standing::default();
        for _ in 0..63 {
            standing.record(true);
        }
        assert!(!standing.failing(), "fewer than 64 calls");
        standing.record(true);
        assert!(standing.failing(), "64 failures of 64");
        for _ in 0..16 {
            standing.record(false);
        }
        assert!(standing.failing(), "48 of the last 64");
        standing.record(false);
        assert!(!standing.failing(), "47 of the last 64");
    }

    /// A [`Contention`] of a test's own, so tests running at once in this
    /// process do not see each other's.
    fn contention() -> &'static Contention {
        Box::leak(Box::default())
    }

    /// A task on a one-worker runtime is woken by another, which then
    /// keeps the worker for `held` before the first is polled. Returns
    /// whether that marked the CPU contended; `failing` makes the first
    /// task a failing one.
    fn kept_from_the_cpu(held: Duration, failing: bool, others_failing: bool) -> bool {
        let contention = contention();
        if others_failing {
            contention.failing.store(1, Ordering::Relaxed);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (wake, woken) = tokio::sync::oneshot::channel::<()>();
            let waiting = tokio::spawn(Sliced::sharing(
                move |mut slice| async move {
                    for _ in 0..64 {
                        slice.record(failing);
                    }
                    // Judged at the end of this poll: it watches from the
                    // next.
                    tokio::task::yield_now().await;
                    woken.await.unwrap();
                },
                contention,
            ));
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            assert!(!waiting.is_finished(), "the task waits for its wake-up");
            wake.send(()).unwrap();
            busy(held);
            waiting.await.unwrap();
        });
        contention.contended(Instant::now())
    }

    #[test]
    fn a_healthy_task_kept_from_the_cpu_marks_it_contended() {
        assert!(
            kept_from_the_cpu(STARVED * 2, false, true),
            "a healthy task waited twice STARVED for its worker"
        );
        assert!(
            !kept_from_the_cpu(Duration::ZERO, false, true),
            "a healthy task polled again at once"
        );
        assert!(
            !kept_from_the_cpu(STARVED * 2, true, true),
            "a failing task's wait says nothing of the others"
        );
        assert!(
            !kept_from_the_cpu(STARVED * 2, false, false),
            "with no task failing, nobody watches"
        );
    }

    /// How long, on the runtime's paused clock, a task that has run a
    /// whole slice waits at [`Slice::yield_if_spent`].
    fn deferred_for(failing: bool, contended: bool) -> Duration {
        let contention = contention();
        if contended {
            contention.starved(Instant::now());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let deferred = runtime.block_on(Sliced::sharing(
            move |mut slice| async move {
                for _ in 0..64 {
                    slice.record(failing);
                }
                busy(SLICE);
                let start = tokio::time::Instant::now();
                slice.yield_if_spent().await;
                start.elapsed()
            },
            contention,
        ));
        assert_eq!(
            contention.failing.load(Ordering::Relaxed),
            0,
            "a task that ended counts as failing no more"
        );
        deferred
    }

    #[test]
    fn a_failing_task_defers_only_while_the_cpu_is_contended() {
        assert_eq!(deferred_for(true, true), DEFER);
        assert_eq!(deferred_for(true, false), Duration::ZERO);
        assert_eq!(deferred_for(false, true), Duration::ZERO);
    }
}
