//! {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
//! Kafka message and routes the message on by the outcome.
//!
//! Besides deciding, it shows the two things a handler may be granted: one
//! HTTP call (`hopper:handler/http.fetch`) and one emitted record. Each happens only when the route's config asks for it:
//! - `lookup-url`: a URL to GET for each message; the route must grant its
//!   host in `allowed_hosts`;
//! - `out-topic`: a topic to pass the message on to, with the lookup's
//!   status in a header; the route must grant it in `emit_topics`.

wit_bindgen::generate!({
    path: "wit",
    world: "handler",
});

use hopper::handler::config;
use hopper::handler::emit::{self, Outgoing};
use hopper::handler::http::{self, Request};
use hopper::handler::log::{Level, log};
use hopper::handler::types::{Failure, Header};

struct Handler;

impl Guest for Handler {
    fn handle(message: Message) -> Outcome {
        let Some(payload) = message.payload else {
            return fatal("a tombstone has nothing to handle".into());
        };
        // One HTTP call. A service that does not answer, or answers 5xx,
        // may be back later: retryable. Any other failure is fatal.
        let mut status = None;
        if let Some(url) = config::get("lookup-url") {
            match get(&url) {
                Ok((code, _)) if (200..300).contains(&code) => status = Some(code),
                // Over its limits, or down for a while: the service may say
                // when to come back, and the message waits at least that
                // long in the route's retry tiers.
                Ok((code @ (429 | 503), wait)) => {
                    return retryable_after(format!("{url} answered HTTP {code}"), wait);
                }
                Ok((code, _)) if code >= 500 => {
                    return retryable(format!("{url} answered HTTP {code}"));
                }
                Ok((code, _)) => return fatal(format!("{url} answered HTTP {code}")),
                Err(why) => return retryable(format!("{url} unreachable: {why}")),
            }
        }
        // One emitted record. It is produced only if this call returns
        // `ok`, before the message's offset is committed.
        if let Some(topic) = config::get("out-topic") {
            let record = Outgoing {
                topic: topic.clone(),
                key: message.key,
                payload: Some(payload.clone()),
                headers: status
                    .map(|code| Header {
                        key: "lookup-status".into(),
                        value: code.to_string().into_bytes(),
                    })
                    .into_iter()
                    .collect(),
                delay_ms: None,
            };
            if let Err(err) = emit::publish(&record) {
                return fatal(format!("cannot emit to {topic}: {err:?}"));
            }
        }
        log(
            Level::Info,
            &format!(
                "Handled message {} ({} bytes) on attempt {}.",
                message.id,
                payload.len(),
                message.attempt
            ),
        );
        Outcome::Ok
    }
}

/// The status of `GET url` and the wait its `retry-after` header asks for,
/// or why there is no response: the host's `fetch-error` says (`denied` for
/// a host the route does not grant, `timeout` for a service too slow, or
/// one whose limits in the route's `http.hosts` kept the request waiting).
fn get(url: &str) -> Result<(u16, Option<u64>), String> {
    let response = http::fetch(&Request {
        method: "GET".into(),
        url: url.into(),
        headers: Vec::new(),
        body: None,
    })
    .map_err(|e| format!("{e:?}"))?;
    let wait = response
        .headers
        .iter()
        .find(|(name, _)| name == "retry-after")
        .and_then(|(_, value)| retry_after_ms(value));
    Ok((response.status, wait))
}

/// A `retry-after` value in milliseconds from now: seconds (`120`), or an
/// HTTP date (`Wed, 21 Oct 2026 07:28:00 GMT`; one in the past is no wait).
fn retry_after_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000));
    }
    // IMF-fixdate: `Day, DD Mon YYYY HH:MM:SS GMT`.
    let mut parts = value.split([' ', ':']).skip(1);
    let mut next = || parts.next();
    let day: i64 = next()?.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let name = next()?;
    let month = MONTHS.iter().position(|m| *m == name)? as i64 + 1;
    let year: i64 = next()?.parse().ok()?;
    let (h, m, s): (i64, i64, i64) = (
        next()?.parse().ok()?,
        next()?.parse().ok()?,
        next()?.parse().ok()?,
    );
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let at_ms = (days * 86_400 + h * 3600 + m * 60 + s) * 1000;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis() as i64;
    Some(at_ms.saturating_sub(now_ms).max(0) as u64)
}

fn retryable(reason: String) -> Outcome {
    retryable_after(reason, None)
}

/// `retryable`, waiting at least `retry_after_ms` before the next attempt:
/// hopper picks the first retry tier that waits that long.
fn retryable_after(reason: String, retry_after_ms: Option<u64>) -> Outcome {
    log(Level::Warn, &reason);
    Outcome::Retryable(Failure {
        reason,
        retry_after_ms,
    })
}

fn fatal(reason: String) -> Outcome {
    log(Level::Error, &reason);
    Outcome::Fatal(Failure {
        reason,
        retry_after_ms: None,
    })
}

export!(Handler);
