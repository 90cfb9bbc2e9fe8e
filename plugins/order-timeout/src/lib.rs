//! The order-timeout handler: hopper delivers an order's timeout when its
//! payment window has closed, and this handler asks the order service to
//! close the order if it is still unpaid.
//!
//! Payload (JSON): an object with a string `order_id`; other fields are
//! ignored. Route config values:
//! - `order-service`: the service's base URL, e.g. `http://127.0.0.1:8080`
//!   (the route must grant it in `allowed_hosts`);
//! - `closed-topic`: where closed orders are announced (default
//!   `orders.closed`; the route must grant it in `emit_topics`).
//!
//! One request, `POST {order-service}/orders/{order_id}/close`, and its
//! answer decides the verdict:
//! - 200, closed → emit the service's body to `closed-topic`, keyed by the
//!   order id → `ok`;
//! - 409 with status `paid` or `cancelled`: nothing to close → `ok`;
//! - 409 with any other status → `fatal` (v2, built with the `refunds`
//!   feature, also takes `refunded` as nothing to close);
//! - 404 → `fatal`: the service does not know the order;
//! - 5xx, or no answer at all (refused, timed out, denied) → `retryable`;
//! - any other status, or a payload that is not an order → `fatal`.
//!
//! The Python, JavaScript and C builds (plugins/order-timeout-*) do the same
//! with the same reasons, log lines and emitted records.

wit_bindgen::generate!({
    path: "../../wit",
    world: "handler",
});

mod service;

use hopper::handler::config;
use hopper::handler::emit::{self, EmitError};
use hopper::handler::log::{Level, log};
use hopper::handler::types::{Failure, Header};
use serde::Deserialize;

/// The payload: an order's timeout.
#[derive(Deserialize)]
struct Timeout {
    order_id: String,
}

/// What the service says about an order it would not close (409).
#[derive(Deserialize)]
struct Conflict {
    status: String,
}

struct OrderTimeout;

impl Guest for OrderTimeout {
    fn handle(message: Message) -> Outcome {
        let payload = message.payload.unwrap_or_default();
        let order = match serde_json::from_slice::<Timeout>(&payload) {
            Ok(timeout) => timeout.order_id,
            Err(err) => return fatal(format!("payload is not an order: {err}")),
        };
        let Some(base) = config::get("order-service") else {
            return fatal("route config sets no `order-service` URL".into());
        };
        let topic = config::get("closed-topic").unwrap_or_else(|| "orders.closed".into());
        let url = match service::close_url(&base, &order) {
            Ok(url) => url,
            Err(reason) => return fatal(reason),
        };
        let answer = match service::post(&url) {
            Ok(answer) => answer,
            Err(detail) => {
                log(
                    Level::Warn,
                    &format!("Order service unreachable closing order {order}: {detail}."),
                );
                return retryable("order service unreachable".into());
            }
        };
        match answer.status {
            200 => announce(&order, &topic, answer.body),
            409 => {
                let status = serde_json::from_slice::<Conflict>(&answer.body)
                    .map(|c| c.status)
                    .unwrap_or_default();
                nothing_to_close(&order, &status)
            }
            404 => fatal(format!("order {order} is unknown to the order service")),
            500..=599 => {
                let status = answer.status;
                log(
                    Level::Warn,
                    &format!("Order service unavailable (HTTP {status}) closing order {order}."),
                );
                let reason = format!("order service unavailable (HTTP {status})");
                retryable(reason)
            }
            other => fatal(format!(
                "order service answered HTTP {other} closing order {order}"
            )),
        }
    }
}

/// The order is closed: publish the service's record of it.
fn announce(order: &str, topic: &str, body: Vec<u8>) -> Outcome {
    let record = emit::Outgoing {
        topic: topic.to_string(),
        key: Some(order.as_bytes().to_vec()),
        payload: Some(body),
        headers: vec![Header {
            key: "content-type".into(),
            value: b"application/json".to_vec(),
        }],
        delay_ms: None,
    };
    match emit::publish(&record) {
        Ok(id) => {
            log(
                Level::Info,
                &format!("Closed unpaid order {order}; announced it on {topic} as {id}."),
            );
            Outcome::Ok
        }
        Err(err) => fatal(format!(
            "cannot announce order {order} on {topic}: {}",
            refused(&err)
        )),
    }
}

/// The order-timeout contract's words for a refused emit, the same in
/// every language.
fn refused(err: &EmitError) -> String {
    match err {
        EmitError::TopicNotGranted(topic) => format!("topic {topic} is not granted"),
        EmitError::TooManyRecords(limit) => format!("more than {limit} records"),
        EmitError::TooLarge(limit) => format!("more than {limit} bytes"),
        EmitError::NoDelayRelay => "no delay relay".into(),
        EmitError::Invalid(why) => format!("invalid record: {why}"),
    }
}

/// 409: the service would not close the order; its status says why.
fn nothing_to_close(order: &str, status: &str) -> Outcome {
    let done = matches!(status, "paid" | "cancelled")
        || (cfg!(feature = "refunds") && status == "refunded");
    if done {
        log(
            Level::Info,
            &format!("Order {order} is {status}, nothing to close."),
        );
        Outcome::Ok
    } else {
        fatal(format!("order {order} has unknown status `{status}`"))
    }
}

fn retryable(reason: String) -> Outcome {
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

export!(OrderTimeout);
