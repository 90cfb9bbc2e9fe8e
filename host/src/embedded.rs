//! The embedded broker: librdkafka's in-process mock cluster, for the demo
//! and for trying hopper without Kafka. It listens on a real 127.0.0.1 port,
//! so any Kafka client on this machine can reach it while hopper runs.
//!
//! Not for production: it keeps everything in memory and loses it on exit.

use crate::config::Config;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

/// Why the embedded broker could not serve a config.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot start the embedded broker: {0}")]
    Start(rdkafka::error::KafkaError),
    #[error("cannot create topic {topic} on the embedded broker: {error}")]
    CreateTopic {
        topic: String,
        error: rdkafka::error::KafkaError,
    },
    /// Neither brokers nor the embedded broker were asked for.
    #[error(
        "no brokers: set kafka.brokers in the config, or pass --brokers (or HOPPER_BROKERS); \
         to try hopper on an in-memory broker that keeps nothing, pass --embedded or set kafka.embedded = true"
    )]
    NoBrokers,
}

pub struct EmbeddedBroker {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl EmbeddedBroker {
    pub fn start() -> Result<EmbeddedBroker, EmbeddedError> {
        let cluster = MockCluster::new(1).map_err(EmbeddedError::Start)?;
        Ok(EmbeddedBroker { cluster })
    }

    /// Starts a broker for `config`: creates every topic the config reads or
    /// writes and points `config.kafka.brokers` at it. The broker must
    /// outlive the hopper that uses it.
    pub fn serve(config: &mut Config) -> Result<EmbeddedBroker, EmbeddedError> {
        let broker = EmbeddedBroker::start()?;
        broker.create_topics(&config.all_topics(), config.kafka.partitions)?;
        config.kafka.brokers = Some(broker.bootstrap_servers());
        Ok(broker)
    }

    /// Starts a broker for `config` when one is asked for: by `--embedded`
    /// (`asked`, which wins over `kafka.brokers`), or by `kafka.embedded =
    /// true` in a config without brokers. A config with neither brokers nor
    /// the flag is an error that says how to fix it: an in-memory broker is
    /// never chosen silently, because it loses every message on exit.
    pub fn when_asked(
        config: &mut Config,
        asked: bool,
    ) -> Result<Option<EmbeddedBroker>, EmbeddedError> {
        let has_brokers = config
            .kafka
            .brokers
            .as_deref()
            .is_some_and(|b| !b.trim().is_empty());
        if !asked && has_brokers {
            return Ok(None);
        }
        if !asked && !config.kafka.embedded {
            return Err(EmbeddedError::NoBrokers);
        }
        EmbeddedBroker::serve(config).map(Some)
    }

    /// The mock cluster itself: its broker can be taken down and brought
    /// back, and errors injected into its requests (the fault tests).
    pub fn mock(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }

    /// `127.0.0.1:PORT`.
    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Creates topics through the mock API (admin CreateTopics does not work
    /// against the mock cluster).
    pub fn create_topics<'a>(
        &self,
        topics: impl IntoIterator<Item = &'a String>,
        partitions: i32,
    ) -> Result<(), EmbeddedError> {
        for topic in topics {
            self.cluster
                .create_topic(topic, partitions, 1)
                .map_err(|error| EmbeddedError::CreateTopic {
                    topic: topic.clone(),
                    error,
                })?;
        }
        Ok(())
    }
}
