//! {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
//! Kafka message and routes the message on by the outcome.
//!
//! Besides deciding, it does the two things a handler may be granted: one
//! HTTP call (through `wasi:http`, with the `wasip2` crate) and one emitted
//! record. Route config values, and the grants they need:
//! - `lookup-url`: a URL to GET for each message (`allowed_hosts`);
//! - `out-topic`: where the message goes on (`emit_topics`), by default
//!   `{{name}}.out`.

wit_bindgen::generate!({
    path: "wit",
    world: "handler",
});

use hopper::handler::config;
use hopper::handler::emit::{self, Outgoing};
use hopper::handler::log::{Level, log};
use hopper::handler::types::{Failure, Header};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingRequest, Scheme};

struct Handler;

impl Guest for Handler {
    fn handle(message: Message) -> Outcome {
        let Some(payload) = message.payload else {
            return fatal("a tombstone has nothing to handle".into());
        };
        let Some(url) = config::get("lookup-url") else {
            return fatal("route config sets no `lookup-url`".into());
        };
        // A service that does not answer, or answers 5xx, may be back later.
        let status = match get(&url) {
            Ok(status) => status,
            Err(why) => return retryable(format!("{url} unreachable: {why}")),
        };
        if status >= 500 {
            return retryable(format!("{url} answered HTTP {status}"));
        }
        if !(200..300).contains(&status) {
            return fatal(format!("{url} answered HTTP {status}"));
        }
        // Produced only if this call returns `ok`, before the message's
        // offset is committed.
        let topic = config::get("out-topic").unwrap_or_else(|| "{{name}}.out".into());
        let record = Outgoing {
            topic: topic.clone(),
            key: message.key,
            payload: Some(payload),
            headers: vec![Header {
                key: "lookup-status".into(),
                value: status.to_string().into_bytes(),
            }],
            delay_ms: None,
        };
        match emit::publish(&record) {
            Ok(id) => {
                log(
                    Level::Info,
                    &format!("Passed message {} on to {topic} as {id}.", message.id),
                );
                Outcome::Ok
            }
            Err(err) => fatal(format!("cannot emit to {topic}: {err:?}")),
        }
    }
}

/// The status of `GET url`, or why there is none (refused, timed out, not
/// granted: the host answers `HTTP-request-denied`).
fn get(url: &str) -> Result<u16, String> {
    let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let request = OutgoingRequest::new(Fields::new());
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(format!("unsupported scheme {scheme}")),
    };
    let path = if path.is_empty() { "/" } else { path };
    request.set_method(&Method::Get).map_err(|()| "bad method")?;
    request.set_scheme(Some(&scheme)).map_err(|()| "bad scheme")?;
    request.set_authority(Some(authority)).map_err(|()| "bad host")?;
    request.set_path_with_query(Some(path)).map_err(|()| "bad path")?;
    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    // The export is synchronous: block until the answer is there.
    pending.subscribe().block();
    match pending.get() {
        Some(Ok(Ok(response))) => Ok(response.status()),
        Some(Ok(Err(code))) => Err(format!("{code:?}")),
        _ => Err("no response".into()),
    }
}

fn retryable(reason: String) -> Outcome {
    log(Level::Warn, &reason);
    Outcome::Retryable(Failure {
        reason,
        retry_after_ms: None,
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
