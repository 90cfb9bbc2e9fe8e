//! `[route.http.hosts."ENTRY"]`: how many requests a route sends to one
//! service at once (`max_concurrent`) and how fast (`rate`, with a
//! `burst`). A request over a limit waits its turn, in order of arrival,
//! within its call's deadline; nothing blocks a thread while it waits.
//!
//! One [`HostLimiter`] per limited `allowed_hosts` entry of a route, held
//! by the route's grants, so every version of the route's handler and
//! every partition's calls share it (plugin/grants.rs).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
// tokio's clock, which a test may pause.
use tokio::time::Instant;

/// A `rate` as resolved: one request per `interval`, and up to `burst` at
/// once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub interval: Duration,
    pub burst: u32,
}

impl Rate {
    /// Requests per second.
    pub fn per_second(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }
}

impl fmt::Display for Rate {
    /// `rate = 10/s, burst 2`, the rate to a thousandth.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = format!("{:.3}", self.per_second());
        let rate = rate.trim_end_matches('0').trim_end_matches('.');
        write!(f, "rate = {rate}/s, burst {}", self.burst)
    }
}

/// The limits of one `allowed_hosts` entry, as resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLimit {
    /// The entry's place in `allowed_hosts`.
    pub entry: usize,
    /// The entry as the config writes it, for messages.
    pub name: String,
    pub max_concurrent: Option<u32>,
    pub rate: Option<Rate>,
}

impl fmt::Display for HostLimit {
    /// `http.hosts."https://api.example.com": max_concurrent = 4, rate = 10/s, burst 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http.hosts.\"{}\":", self.name)?;
        if let Some(n) = self.max_concurrent {
            write!(f, " max_concurrent = {n}")?;
        }
        if let Some(rate) = self.rate {
            let sep = if self.max_concurrent.is_some() {
                ","
            } else {
                ""
            };
            write!(f, "{sep} {rate}")?;
        }
        Ok(())
    }
}

/// Why a request did not get its turn before its call's deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The `allowed_hosts` entry whose limit it waited for.
    pub entry: String,
    /// Which limit, as written (`max_concurrent = 4`, `rate = 10/s, burst 2`).
    pub limit: String,
    pub waited: Duration,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "waited {} ms for http.hosts.\"{}\" ({}), and the call's timeout came first",
            self.waited.as_millis(),
            self.entry,
            self.limit
        )
    }
}

/// A request's turn: the slot it holds under `max_concurrent` (given back
/// when dropped), and how long it waited for it.
pub struct Turn {
    pub permit: Option<OwnedSemaphorePermit>,
    pub waited: Duration,
}

/// The state of one entry's limits, shared by every call of its route.
pub struct HostLimiter {
    limit: HostLimit,
    /// `max_concurrent` slots. tokio's semaphore hands them out in the
    /// order they were asked for, so waiting requests go first come, first
    /// served.
    slots: Option<Arc<Semaphore>>,
    /// The next request's earliest time under `rate`.
    // std Mutex: held for a few comparisons, never across an .await.
    bucket: Option<Mutex<Bucket>>,
}

/// How late a sleep may wake: a request that arrives within it of its
/// theoretical time is counted at that time.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// `rate` as the generic cell rate algorithm keeps it: the theoretical
/// time of the next request, `tat`. A request may go `tau` (burst - 1
/// intervals) before it; each one taken moves it one interval on.
struct Bucket {
    interval: Duration,
    tau: Duration,
    tat: Instant,
}

impl HostLimiter {
    pub fn new(limit: HostLimit) -> HostLimiter {
        let slots = limit
            .max_concurrent
            .map(|n| Arc::new(Semaphore::new(n as usize)));
        let bucket = limit.rate.map(|rate| {
            Mutex::new(Bucket {
                interval: rate.interval,
                tau: rate.interval * rate.burst.saturating_sub(1),
                tat: Instant::now(),
            })
        });
        HostLimiter {
            limit,
            slots,
            bucket,
        }
    }

    pub fn limit(&self) -> &HostLimit {
        &self.limit
    }

    /// Waits for the request's turn: a slot under `max_concurrent` first,
    /// then its time under `rate` (so requests holding a slot are the ones
    /// sent at the rate, and the service sees no burst when slots free up).
    /// Refused when the deadline comes first, or when its time under `rate`
    /// would come after the deadline: then it is refused at once, without
    /// taking that time from the requests behind it.
    pub async fn turn(&self, deadline: Instant) -> Result<Turn, Refused> {
        let started = Instant::now();
        let permit = match &self.slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let acquired =
                        tokio::time::timeout_at(deadline, slots.clone().acquire_owned()).await;
                    match acquired {
                        Ok(Ok(permit)) => Some(permit),
                        // Timed out; the semaphore is never closed.
                        _ => return Err(self.refused(Which::MaxConcurrent, started)),
                    }
                }
            },
        };
        if let Some(bucket) = &self.bucket {
            let at = {
                let mut b = bucket.lock().unwrap();
                let now = Instant::now();
                let at = now.max(b.tat.checked_sub(b.tau).unwrap_or(now));
                if at > deadline {
                    return Err(self.refused(Which::Rate, started));
                }
                // A caller back within a timer tick of its time keeps its
                // schedule: tokio wakes a sleep up to 1 ms late, and a lone
                // caller at more than ~500/s would otherwise lose that much
                // of every interval (held at 0.62x of a 1,510/s rate).
                b.tat = b.tat.max(now.checked_sub(TIMER_TICK).unwrap_or(now)) + b.interval;
                at
            };
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
        }
        Ok(Turn {
            permit,
            waited: started.elapsed(),
        })
    }

    fn refused(&self, which: Which, started: Instant) -> Refused {
        let limit = match (which, &self.limit) {
            (Which::Rate, HostLimit { rate: Some(r), .. }) => r.to_string(),
            (_, HostLimit { max_concurrent, .. }) => {
                format!("max_concurrent = {}", max_concurrent.unwrap_or_default())
            }
        };
        Refused {
            entry: self.limit.name.clone(),
            limit,
            waited: started.elapsed(),
        }
    }
}

#[derive(Clone, Copy)]
enum Which {
    MaxConcurrent,
    Rate,
}

/// A response body that holds its request's `max_concurrent` slot until it
/// ends or is dropped: a request is in flight until its response is read.
pub struct Holding<B> {
    body: B,
    permit: Option<OwnedSemaphorePermit>,
}

impl<B> Holding<B> {
    pub fn new(body: B, permit: Option<OwnedSemaphorePermit>) -> Holding<B> {
        Holding { body, permit }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Holding<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max_concurrent: Option<u32>, rate: Option<(u64, u32)>) -> HostLimiter {
        HostLimiter::new(HostLimit {
            entry: 0,
            name: "http://127.0.0.1:1".into(),
            max_concurrent,
            rate: rate.map(|(ms, burst)| Rate {
                interval: Duration::from_millis(ms),
                burst,
            }),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_handed_out_in_order_and_a_deadline_ends_the_wait() {
        let l = Arc::new(limiter(Some(1), None));
        let far = Instant::now() + Duration::from_secs(60);
        let first = l.turn(far).await.unwrap();
        assert!(first.permit.is_some());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..3 {
            let (l, tx) = (l.clone(), tx.clone());
            tokio::spawn(async move {
                let turn = l.turn(far).await.unwrap();
                tx.send(n).unwrap();
                drop(turn);
            });
            // Each waiter queues before the next one is spawned.
            tokio::task::yield_now().await;
        }
        let refused = l
            .turn(Instant::now() + Duration::from_millis(20))
            .await
            .err()
            .expect("no slot before its deadline");
        assert_eq!(refused.limit, "max_concurrent = 1");
        assert!(refused.waited >= Duration::from_millis(20), "{refused:?}");
        assert!(
            refused
                .to_string()
                .contains("http.hosts.\"http://127.0.0.1:1\""),
            "{refused}"
        );
        drop(first);
        let order: Vec<i32> = [rx.recv().await, rx.recv().await, rx.recv().await]
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(order, [0, 1, 2], "first come, first served");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_spaces_requests_after_its_burst_and_refuses_past_the_deadline() {
        let l = limiter(None, Some((100, 3)));
        let start = Instant::now();
        let far = start + Duration::from_secs(60);
        let mut at = Vec::new();
        for _ in 0..6 {
            l.turn(far).await.unwrap();
            at.push(start.elapsed().as_millis());
        }
        assert_eq!(at, [0, 0, 0, 100, 200, 300], "a burst of 3, then 10/s");
        let soon = Instant::now() + Duration::from_millis(50);
        let refused = l
            .turn(soon)
            .await
            .err()
            .expect("its time is after the deadline");
        assert_eq!(refused.limit, "rate = 10/s, burst 3");
        // The refused request took no time from the next one.
        l.turn(far).await.unwrap();
        assert_eq!(start.elapsed().as_millis(), 400);
    }
}
