//! Reading a delayed message's schedule from its headers, and choosing its
//! next step down the tier ladder.

use crate::headers::{self, Reason};
use rdkafka::message::Headers;
use std::time::Duration;

/// A hop aims to land this much before the message's time, so the last
/// stretch is always timed by the in-memory scheduler, not by a tier's
/// poll latency.
pub const HOP_MARGIN: Duration = Duration::from_millis(250);

/// Headers the relay owns; each hop replaces them, and the forward to the
/// target removes them.
pub(super) const SCHEDULING: [&str; 7] = [
    headers::TARGET,
    headers::DELIVER_AT,
    headers::DELAY,
    headers::DUE_AT,
    headers::INBOX_POSITION,
    headers::CANCEL,
    headers::REPLACE,
];

/// The next step for a message with `remaining` ms to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Due now (or overdue): forward to the target.
    Forward,
    /// Less than the smallest tier (plus margin) remains: hold in memory.
    Schedule,
    /// Wait in the tier with this wait.
    Tier(Duration),
}

/// Picks the largest tier that fits `remaining_ms` less [`HOP_MARGIN`].
/// `tiers` is sorted, shortest first.
pub fn step(remaining_ms: i64, tiers: &[Duration]) -> Step {
    if remaining_ms <= 0 {
        return Step::Forward;
    }
    let budget = remaining_ms - HOP_MARGIN.as_millis() as i64;
    match tiers.iter().rev().find(|t| t.as_millis() as i64 <= budget) {
        Some(tier) => Step::Tier(*tier),
        None => Step::Schedule,
    }
}

/// Where and when a delayed message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: String,
    pub target: String,
    pub deliver_at: i64,
}

/// Why a message cannot be scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub reason: Reason,
    pub error: String,
}

pub(super) fn invalid(error: impl Into<String>) -> Rejected {
    Rejected {
        reason: Reason::InvalidEnvelope,
        error: error.into(),
    }
}

/// Reads the schedule of a message. `reference_ms` is when a relative
/// `hopper-delay` counts from (the record's timestamp, or now).
pub fn parse_schedule<H: Headers>(
    headers: Option<&H>,
    default_id: String,
    reference_ms: i64,
    now_ms: i64,
    max_delay: Duration,
) -> Result<Schedule, Rejected> {
    let text = |name| headers::text(headers, name).map_err(|e| invalid(e.to_string()));
    let target = text(headers::TARGET)?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| invalid(format!("header {} is missing", headers::TARGET)))?;
    if let Some(bad) = target
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(invalid(format!(
            "header {}: `{}` is not a valid topic name (it has `{bad}`)",
            headers::TARGET,
            headers::shorten(target, 64)
        )));
    }
    let deliver_at = match (text(headers::DELIVER_AT)?, text(headers::DELAY)?) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "set either {} or {}, not both",
                headers::DELIVER_AT,
                headers::DELAY
            )));
        }
        (None, None) => {
            return Err(invalid(format!(
                "header {} or {} is missing",
                headers::DELIVER_AT,
                headers::DELAY
            )));
        }
        (Some(at), None) => parse_instant(at)
            .map_err(|e| invalid(format!("header {}: {e}", headers::DELIVER_AT)))?,
        (None, Some(delay)) => {
            let delay = humantime::parse_duration(delay).map_err(|e| {
                invalid(format!(
                    "header {}: `{}` is not a duration ({e})",
                    headers::DELAY,
                    headers::shorten(delay, 64)
                ))
            })?;
            let delay = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            reference_ms.max(0).saturating_add(delay)
        }
    };
    // Checked: `deliver_at` comes from a header, and every later step
    // (the tier choice, the scheduler, lateness) works from this difference.
    let remaining = deliver_at.checked_sub(now_ms).ok_or_else(|| {
        invalid(format!(
            "header {}: `{deliver_at}` is out of range",
            headers::DELIVER_AT
        ))
    })?;
    let max_delay_ms = i64::try_from(max_delay.as_millis()).unwrap_or(i64::MAX);
    if remaining > max_delay_ms {
        return Err(Rejected {
            reason: Reason::DelayTooLong,
            error: format!(
                "deliver-at {deliver_at} is {} away; the maximum delay is {}",
                humantime::format_duration(Duration::from_millis(
                    remaining.unsigned_abs() / 1000 * 1000
                )),
                humantime::format_duration(max_delay)
            ),
        });
    }
    let id = match text(headers::ID)? {
        Some(id) if !id.is_empty() && id.len() <= headers::MAX_ID_BYTES => id.to_string(),
        Some(id) => {
            return Err(invalid(format!(
                "header {}: must be 1 to {} bytes, not {}",
                headers::ID,
                headers::MAX_ID_BYTES,
                id.len()
            )));
        }
        None => default_id,
    };
    Ok(Schedule {
        id,
        target: target.to_string(),
        deliver_at,
    })
}

/// Epoch milliseconds, or an RFC 3339 time; never before 1970, so that
/// the time left until it (`deliver_at - now`) cannot overflow.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        if ms < 0 {
            return Err(format!(
                "`{ms}` is before 1970: epoch milliseconds cannot be negative"
            ));
        }
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(text)
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0)
        })
        .map_err(|_| {
            format!(
                "`{}` is neither epoch milliseconds nor an RFC 3339 time",
                headers::shorten(text, 64)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders};

    const TIERS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(30),
    ];

    #[test]
    fn picks_the_largest_tier_that_fits_with_margin() {
        assert_eq!(step(0, &TIERS), Step::Forward);
        assert_eq!(step(-5, &TIERS), Step::Forward);
        assert_eq!(step(1, &TIERS), Step::Schedule);
        assert_eq!(step(1_249, &TIERS), Step::Schedule);
        assert_eq!(step(1_250, &TIERS), Step::Tier(Duration::from_secs(1)));
        assert_eq!(step(5_249, &TIERS), Step::Tier(Duration::from_secs(1)));
        assert_eq!(step(5_250, &TIERS), Step::Tier(Duration::from_secs(5)));
        assert_eq!(
            step(86_400_000, &TIERS),
            Step::Tier(Duration::from_secs(30))
        );
    }

    /// Walks a delay down the ladder on tokio's paused clock, hop by hop,
    /// and checks it lands exactly at its time, never early, through the
    /// tiers the ladder implies.
    #[tokio::test(start_paused = true)]
    async fn the_cascade_lands_exactly_on_time() {
        let cases: [(i64, &[&str]); 9] = [
            (0, &[]),
            (40, &["memory"]),
            (999, &["memory"]),
            (1_000, &["memory"]),
            (1_234, &["memory"]),
            (1_300, &["1s", "memory"]),
            (7_777, &["5s", "1s", "1s", "memory"]),
            (36_500, &["30s", "5s", "1s", "memory"]),
            (
                123_456,
                &["30s", "30s", "30s", "30s", "1s", "1s", "1s", "memory"],
            ),
        ];
        for (deliver_at, expected) in cases {
            let start = tokio::time::Instant::now();
            let clock = || start.elapsed().as_millis() as i64;
            let mut hops = Vec::new();
            loop {
                match step(deliver_at - clock(), &TIERS) {
                    Step::Forward => break,
                    Step::Schedule => {
                        let at = start + Duration::from_millis(deliver_at as u64);
                        tokio::time::sleep_until(at).await;
                        hops.push("memory".to_string());
                    }
                    Step::Tier(wait) => {
                        // A tier hop: the tier's wait, plus a few ms of poll
                        // and produce latency.
                        tokio::time::advance(wait + Duration::from_millis(7)).await;
                        assert!(clock() < deliver_at, "a tier overshot {deliver_at}");
                        hops.push(format!("{}s", wait.as_secs()));
                    }
                }
                assert!(
                    hops.len() < 50,
                    "runaway cascade for {deliver_at}: {hops:?}"
                );
            }
            assert_eq!(clock(), deliver_at, "delay {deliver_at}ms via {hops:?}");
            assert_eq!(hops, expected, "delay {deliver_at}ms");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
        let mut h = OwnedHeaders::new();
        for (k, v) in pairs {
            h = h.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        h
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Schedule, Rejected> {
        let h = headers(pairs);
        parse_schedule(
            Some(&h),
            "in-0-7".into(),
            1_000,
            2_000,
            Duration::from_secs(3600),
        )
    }

    #[test]
    fn schedules_from_deliver_at_or_delay() {
        let s = parse(&[("hopper-target", "orders"), ("hopper-deliver-at", "5000")]).unwrap();
        assert_eq!(
            s,
            Schedule {
                id: "in-0-7".into(),
                target: "orders".into(),
                deliver_at: 5_000
            }
        );
        let s = parse(&[
            ("hopper-target", "orders"),
            ("hopper-delay", "90s"),
            ("hopper-id", "x"),
        ])
        .unwrap();
        assert_eq!(
            (s.deliver_at, s.id.as_str()),
            (91_000, "x"),
            "relative to the record time"
        );
        let s = parse(&[
            ("hopper-target", "t"),
            ("hopper-deliver-at", "1970-01-01T00:00:03Z"),
        ])
        .unwrap();
        assert_eq!(s.deliver_at, 3_000);
    }

    #[test]
    fn bad_schedules_name_the_problem() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (
                &[("hopper-deliver-at", "5000")],
                "header hopper-target is missing",
            ),
            (
                &[("hopper-target", "a b"), ("hopper-delay", "1s")],
                "is not a valid topic name",
            ),
            (
                &[("hopper-target", "t")],
                "header hopper-deliver-at or hopper-delay is missing",
            ),
            (
                &[("hopper-target", "t"), ("hopper-delay", "soon")],
                "header hopper-delay: `soon` is not a duration",
            ),
            (
                &[("hopper-target", "t"), ("hopper-deliver-at", "tomorrow")],
                "neither epoch milliseconds nor an RFC 3339 time",
            ),
            (
                &[
                    ("hopper-target", "t"),
                    ("hopper-delay", "1s"),
                    ("hopper-deliver-at", "1"),
                ],
                "not both",
            ),
        ];
        for (pairs, expected) in cases {
            let err = parse(pairs).unwrap_err();
            assert_eq!(err.reason, Reason::InvalidEnvelope);
            assert!(err.error.contains(expected), "{pairs:?}: {}", err.error);
        }
        for hostile in ["-9223372036854775808", "-1"] {
            let err = parse(&[("hopper-target", "t"), ("hopper-deliver-at", hostile)]).unwrap_err();
            assert_eq!(err.reason, Reason::InvalidEnvelope, "{hostile}");
            assert!(
                err.error.contains("header hopper-deliver-at: `")
                    && err.error.contains("is before 1970"),
                "{hostile}: {}",
                err.error
            );
        }
        let err = parse(&[
            ("hopper-target", "t"),
            ("hopper-deliver-at", "9223372036854775807"),
        ])
        .unwrap_err();
        assert_eq!(err.reason, Reason::DelayTooLong, "{}", err.error);
        let err = parse(&[("hopper-target", "t"), ("hopper-delay", "2h")]).unwrap_err();
        assert_eq!(err.reason, Reason::DelayTooLong);
        assert!(
            err.error.contains("the maximum delay is 1h"),
            "{}",
            err.error
        );
    }
}
