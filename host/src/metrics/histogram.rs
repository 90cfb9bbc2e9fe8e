//! A Prometheus histogram that hot paths update without a lock.
//!
//! prometheus-client's own `Histogram` keeps its buckets behind a mutex, so
//! every call of a route (up to `max_in_flight` per partition, in every
//! partition's task) would take the same lock once per message. Here each bucket is an atomic counter: an observation is one
//! `fetch_add` on its bucket and one on the sum. A scrape reads the buckets
//! one by one, so it may see an observation in a bucket but not yet in the
//! sum; the count is the sum of the buckets, so buckets and count always
//! agree.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Handler call durations, in seconds: 10 µs (a warm no-op call) to 10 s
/// (past any sensible timeout).
pub const CALL_BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.5, 1.0, 10.0,
];

/// Delay lateness, in seconds: 1 ms (the target) to a minute (a relay that
/// was down).
pub const LATENESS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0,
];

/// Waits for a host's limits, in seconds: none to speak of (100 µs) to 10 s
/// (past any sensible call timeout).
pub const WAIT_BUCKETS: [f64; 12] = [
    0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A histogram of durations, cheap to clone (clones share the buckets).
#[derive(Clone, Debug)]
pub struct Histogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds in seconds, for the exposition.
    bounds: Box<[f64]>,
    /// The same bounds in nanoseconds, for the comparison per observation.
    bounds_ns: Box<[u64]>,
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds, in seconds, ascending.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            inner: Arc::new(Inner {
                bounds: bounds.into(),
                bounds_ns: bounds.iter().map(|b| (b * 1e9) as u64).collect(),
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_ns: AtomicU64::new(0),
            }),
        }
    }

    pub fn observe(&self, value: Duration) {
        let ns = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.inner;
        let bucket = inner.bounds_ns.partition_point(|bound| *bound < ns);
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        inner.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of the observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Cumulative buckets: (upper bound in seconds, observations at or below
    /// it), ending with `+Inf`.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        let bounds = self.inner.bounds.iter().copied().chain([f64::INFINITY]);
        bounds
            .zip(self.inner.counts.iter())
            .map(|(bound, count)| {
                total += count.load(Ordering::Relaxed);
                (bound, total)
            })
            .collect()
    }

    /// The value at quantile `q` (0..=1), estimated from the buckets the way
    /// Prometheus' `histogram_quantile` does; `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let buckets = self.buckets();
        let total = buckets.last()?.1;
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut lower = (0.0, 0u64);
        for (bound, count) in buckets {
            if count as f64 >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let within = (count - lower.1) as f64;
                let fraction = if within == 0.0 {
                    1.0
                } else {
                    (rank - lower.1 as f64) / within
                };
                return Some(lower.0 + (bound - lower.0) * fraction);
            }
            lower = (bound, count);
        }
        Some(lower.0)
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets = self.buckets();
        let count = buckets.last().map_or(0, |b| b.1);
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(&[0.001, 0.01, 0.1]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1)); // on the bound: `le` is inclusive
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(3));
        assert_eq!(
            h.buckets(),
            vec![(0.001, 2), (0.01, 3), (0.1, 3), (f64::INFINITY, 4)]
        );
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 3.0065).abs() < 1e-9, "{}", h.sum());
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let h = Histogram::new(&[0.01, 0.02]);
        assert_eq!(h.quantile(0.5), None);
        for _ in 0..10 {
            h.observe(Duration::from_millis(15));
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((p50 - 0.015).abs() < 1e-9, "{p50}");
        h.observe(Duration::from_secs(1));
        assert_eq!(h.quantile(1.0), Some(0.02), "+Inf reports the last bound");
    }
}
