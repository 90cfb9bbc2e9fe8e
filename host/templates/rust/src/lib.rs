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
                Ok(code) if (200..300).contains(&code) => status = Some(code),
                Ok(code) if code >= 500 => {
                    return retryable(format!("{url} answered HTTP {code}"));
                }
                Ok(code) => return fatal(format!("{url} answered HTTP {code}")),
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

/// The status of `GET url`, or why there is none: the host's `fetch-error`
/// says (`denied` for a host the route does not grant, `timeout` for a
/// service too slow).
fn get(url: &str) -> Result<u16, String> {
    let response = http::fetch(&Request {
        method: "GET".into(),
        url: url.into(),
        headers: Vec::new(),
        body: None,
    })
    .map_err(|e| format!("{e:?}"))?;
    Ok(response.status)
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
