//! The order-events handler: the other half of the order-timeout story. It
//! reads what happens to an order and keeps the order's timeout in step,
//! through the delay relay, by id:
//!
//! - `{"event": "created", "order_id": "o-1", "timeout_ms": 1800000}`:
//!   schedules the order's timeout, `{"order_id": "o-1"}` to `timeout-topic`
//!   `timeout_ms` from now, under the id `timeout-o-1`, replacing any
//!   earlier timeout of the order (so a redelivered event leaves one);
//! - `{"event": "paid", "order_id": "o-1"}`: cancels `timeout-o-1`; the
//!   order-timeout handler never hears of the order.
//!
//! Route config: `timeout-topic` (default `orders.timeout`), which the route
//! must grant in `emit_topics`; the route must grant `timeout-*` in
//! `cancel_ids`. Any other event is `ok` and changes nothing; a payload that
//! is not an event, or a schedule or cancel hopper refuses, is `fatal`.

wit_bindgen::generate!({
    path: "../../wit",
    world: "handler",
});

use hopper::handler::config;
use hopper::handler::emit::{self, Scheduled};
use hopper::handler::log::{Level, log};
use hopper::handler::types::Failure;
use serde::Deserialize;

#[derive(Deserialize)]
struct Event {
    event: String,
    order_id: String,
    timeout_ms: Option<u64>,
}

/// How long an order stays open unpaid when its event does not say.
const DEFAULT_TIMEOUT_MS: u64 = 30 * 60 * 1000;

struct OrderEvents;

impl Guest for OrderEvents {
    fn handle(message: Message) -> Outcome {
        let payload = message.payload.unwrap_or_default();
        let event: Event = match serde_json::from_slice(&payload) {
            Ok(event) => event,
            Err(e) => return fatal(format!("payload is not an order event: {e}")),
        };
        let order = &event.order_id;
        let id = format!("timeout-{order}");
        match event.event.as_str() {
            "created" => {
                let topic = config::get("timeout-topic").unwrap_or_else(|| "orders.timeout".into());
                let delay_ms = event.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
                let timeout = Scheduled {
                    id: id.clone(),
                    topic,
                    payload: Some(
                        serde_json::json!({ "order_id": order })
                            .to_string()
                            .into_bytes(),
                    ),
                    headers: Vec::new(),
                    delay_ms,
                    replace: true,
                };
                if let Err(e) = emit::schedule(&timeout) {
                    return fatal(format!("cannot schedule {id}: {e:?}"));
                }
                log(
                    Level::Info,
                    &format!(
                        "Order {order} created: its timeout {id} fires in {delay_ms} ms unless it is paid."
                    ),
                );
            }
            "paid" => {
                if let Err(e) = emit::cancel(&id) {
                    return fatal(format!("cannot cancel {id}: {e:?}"));
                }
                log(
                    Level::Info,
                    &format!("Order {order} paid: cancelling its timeout {id}."),
                );
            }
            _ => {}
        }
        Outcome::Ok
    }
}

fn fatal(reason: String) -> Outcome {
    Outcome::Fatal(Failure {
        reason,
        retry_after_ms: None,
    })
}

export!(OrderEvents);
