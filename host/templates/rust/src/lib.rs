//! {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
//! Kafka message and routes the message on by the outcome.

wit_bindgen::generate!({
    path: "wit",
    world: "handler",
});

use hopper::handler::config;
use hopper::handler::log::{Level, log};
use hopper::handler::types::Failure;

struct Handler;

impl Guest for Handler {
    fn handle(message: Message) -> Outcome {
        let Some(payload) = message.payload else {
            return Outcome::Fatal(Failure {
                reason: "a tombstone has nothing to handle".to_string(),
                retry_after_ms: None,
            });
        };
        let greeting = config::get("greeting").unwrap_or_else(|| "Handled".to_string());
        log(
            Level::Info,
            &format!(
                "{greeting} message {} ({} bytes) on attempt {}.",
                message.id,
                payload.len(),
                message.attempt
            ),
        );
        Outcome::Ok
    }
}

export!(Handler);
