//! The order-timeout handler: hopper delivers an order event when the order's
//! payment window has closed, and this handler closes the order if it is still
//! unpaid.
//!
//! Payload (JSON): `{"order_id": "o-1", "status": "pending"}` plus, for the
//! demo, an optional `"downstream"` that simulates the order service:
//! - `"flaky"`: unavailable for the first two attempts, then fine;
//! - `"down"`: unavailable on every attempt.
//!
//! Verdicts:
//! - `pending` or `unpaid`: the order is closed → `ok`;
//! - `paid`, `cancelled` or `closed`: nothing to do → `ok`;
//! - any other status, or a payload that is not such JSON → `fatal`;
//! - the order service is unavailable → `retryable`.

wit_bindgen::generate!({
    path: "../../wit",
    world: "handler",
});

use hopper::handler::config;
use hopper::handler::log::{Level, log};
use hopper::handler::types::Failure;
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: String,
    status: String,
    #[serde(default)]
    downstream: Option<String>,
}

struct OrderTimeout;

impl Guest for OrderTimeout {
    fn handle(message: Message) -> Outcome {
        let payload = message.payload.unwrap_or_default();
        let order: Order = match serde_json::from_slice(&payload) {
            Ok(order) => order,
            Err(err) => return fatal(format!("payload is not an order: {err}")),
        };
        let service = config::get("order-service").unwrap_or_else(|| "orders".to_string());

        match order.status.as_str() {
            "paid" | "cancelled" | "closed" => {
                log(
                    Level::Info,
                    &format!("Order {} is {}, nothing to close.", order.order_id, order.status),
                );
                Outcome::Ok
            }
            "pending" | "unpaid" => {
                let unavailable = match order.downstream.as_deref() {
                    Some("down") => true,
                    Some("flaky") => message.attempt < 3,
                    _ => false,
                };
                if unavailable {
                    log(
                        Level::Warn,
                        &format!(
                            "Service {service} unavailable closing order {} on attempt {}.",
                            order.order_id, message.attempt
                        ),
                    );
                    return Outcome::Retryable(Failure {
                        reason: format!("{service} service unavailable"),
                        retry_after_ms: None,
                    });
                }
                log(
                    Level::Info,
                    &format!("Closed unpaid order {} via {service}.", order.order_id),
                );
                Outcome::Ok
            }
            #[cfg(feature = "refunds")]
            "refunded" => {
                log(
                    Level::Info,
                    &format!("Order {} was refunded, nothing to close.", order.order_id),
                );
                Outcome::Ok
            }
            other => fatal(format!("order {} has unknown status `{other}`", order.order_id)),
        }
    }
}

fn fatal(reason: String) -> Outcome {
    log(Level::Error, &reason);
    Outcome::Fatal(Failure {
        reason,
        retry_after_ms: None,
    })
}

export!(OrderTimeout);
