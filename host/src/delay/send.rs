//! The client side of the relay: scheduling a message from Rust.

use crate::clock::now_ms;
use crate::headers;
use std::time::Duration;

/// Why a schedule or a cancel was not sent.
#[derive(Debug, thiserror::Error)]
pub enum InboxSendError {
    #[error("an id is 1 to {} bytes, not {len}", headers::MAX_ID_BYTES)]
    Id { len: usize },
    #[error("cannot produce to {inbox}: {error}")]
    Produce {
        inbox: String,
        error: rdkafka::error::KafkaError,
    },
}

/// A message to deliver later: the library side of `hopper send`. Any Kafka
/// client can do the same by producing to the inbox with these headers.
#[derive(Debug, Clone, Default)]
pub struct DelayedMessage {
    pub target: String,
    /// When to deliver, epoch ms. Wins over `delay`.
    pub deliver_at: Option<i64>,
    /// How long to wait, counted from the record's timestamp.
    pub delay: Option<Duration>,
    pub id: Option<String>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Extra headers, delivered to the target unchanged.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl DelayedMessage {
    /// Produces the message to `inbox` and waits for the acknowledgement.
    /// Returns the inbox partition and offset.
    pub async fn send(
        &self,
        producer: &rdkafka::producer::FutureProducer,
        inbox: &str,
    ) -> Result<(i32, i64), InboxSendError> {
        use rdkafka::message::{Header, OwnedHeaders};
        let mut owned = OwnedHeaders::new();
        for (key, value) in &self.headers {
            owned = owned.insert(Header {
                key,
                value: Some(value),
            });
        }
        let put = |owned: OwnedHeaders, key: &str, value: String| {
            owned.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        };
        owned = put(owned, headers::TARGET, self.target.clone());
        owned = match (self.deliver_at, self.delay) {
            (Some(at), _) => put(owned, headers::DELIVER_AT, at.to_string()),
            (None, Some(delay)) => put(owned, headers::DELAY, format!("{}ms", delay.as_millis())),
            (None, None) => put(owned, headers::DELIVER_AT, now_ms().to_string()),
        };
        if let Some(id) = &self.id {
            owned = put(owned, headers::ID, id.clone());
        }
        let mut record = rdkafka::producer::FutureRecord::<[u8], [u8]>::to(inbox).headers(owned);
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(payload) = &self.payload {
            record = record.payload(payload.as_slice());
        }
        let delivery = producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(error, _)| InboxSendError::Produce {
                inbox: inbox.to_string(),
                error,
            })?;
        Ok((delivery.partition, delivery.offset))
    }
}

/// Cancels every pending schedule of `id` that the relay reads before this
/// record: produces `hopper-cancel: true` and `hopper-id`, key = the id, to
/// `inbox`, and waits for the acknowledgement. Returns the inbox partition
/// and offset. The library side of `hopper delay cancel`.
pub async fn cancel(
    producer: &rdkafka::producer::FutureProducer,
    inbox: &str,
    id: &str,
) -> Result<(i32, i64), InboxSendError> {
    use rdkafka::message::{Header, OwnedHeaders};
    if id.is_empty() || id.len() > headers::MAX_ID_BYTES {
        return Err(InboxSendError::Id { len: id.len() });
    }
    let owned = OwnedHeaders::new()
        .insert(Header {
            key: headers::CANCEL,
            value: Some("true"),
        })
        .insert(Header {
            key: headers::ID,
            value: Some(id),
        });
    let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(inbox)
        .key(id)
        .headers(owned);
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(error, _)| InboxSendError::Produce {
            inbox: inbox.to_string(),
            error,
        })?;
    Ok((delivery.partition, delivery.offset))
}
