//! `[kafka]`: how hopper reaches Kafka, and the client properties it
//! guards.

use super::secrets::{Secrets, is_source, read_source};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Properties hopper sets itself; a config that sets them is rejected,
/// because changing them would break the delivery guarantees (with
/// `auto.offset.reset = latest`, a tier whose group offsets expired would
/// skip the messages waiting in it).
pub const PROTECTED_PROPERTIES: [&str; 8] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "isolation.level",
    "auto.offset.reset",
];

/// The most hops a producer may be set to hold
/// (`queue.buffering.max.messages`): librdkafka's own queue is given twice
/// as many, and takes at most `i32::MAX`.
pub const MAX_HOPS_HELD: u64 = i32::MAX as u64 / 2;

/// Whether a librdkafka property holds a secret: a password, a client
/// secret, a private key or a passphrase. Its value is never shown; one
/// written into the file itself is warned about at startup.
pub fn is_secret_property(key: &str) -> bool {
    [".password", ".secret", ".passphrase", ".key.pem"]
        .iter()
        .any(|end| key.ends_with(end))
        || key == "sasl.oauthbearer.config"
}

/// How hopper reaches Kafka.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. Required, unless `embedded` is set (or `hopper
    /// run --embedded` is given, or `--brokers` names them).
    pub brokers: Option<String>,
    /// Run on an embedded in-process broker on 127.0.0.1 that keeps
    /// everything in memory: for demos and trials, never production. Off by
    /// default, so that a config that forgot its brokers fails at startup
    /// instead of taking traffic that is lost on exit.
    #[serde(default)]
    pub embedded: bool,
    /// Create missing topics at startup. When false, startup fails naming
    /// every missing topic instead.
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// Partitions of each topic hopper creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor of each topic hopper creates.
    #[serde(default = "default_replication")]
    pub replication: i32,
    /// Extra librdkafka properties for every client, for example
    /// `"security.protocol" = "ssl"`. Hopper's own delivery guarantees
    /// (acks, idempotence, manual offset storage) cannot be overridden. A
    /// value may be `env:NAME` or `file:PATH`, read at startup
    /// ([`KafkaConfig::resolve`]).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// The values of secret properties ([`is_secret_property`]) and of
    /// every value read from `env:` or `file:`: kept out of every log line,
    /// error and answer ([`KafkaConfig::redact`]).
    #[serde(skip)]
    pub secrets: Secrets,
}

/// Shows every property, with each secret's value replaced: a config
/// printed for debugging leaks nothing.
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(key, value)| {
                let shown = if self.is_secret(key, value) {
                    "[secret]"
                } else {
                    value.as_str()
                };
                (key.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("embedded", &self.embedded)
            .field("create_topics", &self.create_topics)
            .field("partitions", &self.partitions)
            .field("replication", &self.replication)
            .field("properties", &properties)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: None,
            embedded: false,
            create_topics: true,
            partitions: default_partitions(),
            replication: default_replication(),
            properties: BTreeMap::new(),
            secrets: Secrets::default(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_partitions() -> i32 {
    3
}
fn default_replication() -> i32 {
    1
}

impl KafkaConfig {
    /// This table with every `env:NAME` and `file:PATH` value read (a path
    /// relative to `base`, the config file's directory), and the secrets
    /// noted for redaction. A value that cannot be read is a problem that
    /// names the property and where it was to come from, never a value.
    pub(super) fn resolve(&self, base: &Path, problems: &mut Vec<String>) -> KafkaConfig {
        let mut resolved = self.clone();
        for (key, value) in &self.properties {
            let secret = is_secret_property(key);
            if is_source(value) {
                match read_source(value, base) {
                    Ok(read) => {
                        resolved.secrets.insert(key, read.clone());
                        resolved.properties.insert(key.clone(), read);
                    }
                    Err(e) => problems.push(format!("kafka.properties.\"{key}\": {e}")),
                }
            } else if secret && value.is_empty() {
                problems.push(format!(
                    "kafka.properties.\"{key}\" is empty: give the secret, as env:NAME or file:PATH, or remove the property"
                ));
            } else if secret {
                tracing::warn!(
                    property = key.as_str(),
                    "A secret is written into the config file: set kafka.properties.\"{key}\" to env:NAME or file:PATH instead."
                );
                resolved.secrets.insert(key, value.clone());
            }
        }
        resolved.check(problems);
        resolved
    }

    /// Whether the value of `key` must not be shown.
    fn is_secret(&self, key: &str, value: &str) -> bool {
        is_secret_property(key) || is_source(value) || self.secrets.get(key).is_some()
    }

    /// `text` with every secret of this table replaced by `[secret KEY]`:
    /// for librdkafka's log lines and errors, which hopper passes on.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        self.secrets.redact(text)
    }

    /// Whether the clients speak TLS to the brokers: `security.protocol`
    /// is `ssl` or `sasl_ssl` (any case).
    pub fn speaks_tls(&self) -> bool {
        self.properties
            .get("security.protocol")
            .is_some_and(|p| matches!(p.trim().to_ascii_lowercase().as_str(), "ssl" | "sasl_ssl"))
    }

    /// What this table's properties turn off of the connection's security,
    /// one sentence each naming the property: TLS certificates not
    /// verified, or not matched to the broker's name; a PLAIN password sent
    /// over `sasl_plaintext`; an OIDC token endpoint over `http://`. Each
    /// is legal (a test cluster may want it), so hopper starts, but it says
    /// so at start and in `/ready`.
    pub fn weakened_security(&self) -> Vec<String> {
        let value = |key: &str| {
            self.properties
                .get(key)
                .map(|v| v.trim().to_ascii_lowercase())
        };
        let mut weakened = Vec::new();
        if let Some(v) = value("enable.ssl.certificate.verification")
            && matches!(v.as_str(), "false" | "0" | "no" | "off")
        {
            weakened.push(
                "kafka.properties.\"enable.ssl.certificate.verification\" is false: the brokers' TLS certificates are not verified, so anyone on the path can pose as a broker".to_string(),
            );
        }
        if value("ssl.endpoint.identification.algorithm").as_deref() == Some("none") {
            weakened.push(
                "kafka.properties.\"ssl.endpoint.identification.algorithm\" is none: a broker's certificate is not matched to its host name, so any certificate the CA signed passes".to_string(),
            );
        }
        let plain = ["sasl.mechanism", "sasl.mechanisms"]
            .iter()
            .any(|key| value(key).as_deref() == Some("plain"));
        if plain && value("security.protocol").as_deref() == Some("sasl_plaintext") {
            weakened.push(
                "kafka.properties.\"security.protocol\" is sasl_plaintext with sasl.mechanism PLAIN: the password crosses the network unencrypted; use sasl_ssl".to_string(),
            );
        }
        if value("sasl.oauthbearer.token.endpoint.url")
            .is_some_and(|url| url.starts_with("http://"))
        {
            weakened.push(
                "kafka.properties.\"sasl.oauthbearer.token.endpoint.url\" is http://: the client secret and the tokens cross the network unencrypted; use https://".to_string(),
            );
        }
        weakened
    }

    /// Adds every problem of this table to `problems`.
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        if self.partitions < 1 {
            problems.push(format!(
                "kafka.partitions must be at least 1, not {}",
                self.partitions
            ));
        }
        if self.replication < 1 {
            problems.push(format!(
                "kafka.replication must be at least 1, not {}",
                self.replication
            ));
        }
        if self.embedded && self.brokers.is_some() {
            problems.push(
                "kafka.embedded = true and kafka.brokers are both set: remove one (the embedded broker is for trials only)"
                    .to_string(),
            );
        }
        for key in self.properties.keys() {
            if PROTECTED_PROPERTIES.contains(&key.as_str()) {
                problems.push(format!(
                    "kafka.properties.\"{key}\" is set by hopper itself and cannot be overridden"
                ));
            }
        }
        if let Some(held) = self.properties.get("queue.buffering.max.messages")
            && !held
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| (1..=MAX_HOPS_HELD).contains(&n))
        {
            problems.push(format!(
                "kafka.properties.\"queue.buffering.max.messages\" must be a whole number of hops from 1 to {MAX_HOPS_HELD}, not {held:?}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(properties: &[(&str, &str)]) -> (KafkaConfig, Vec<String>) {
        let config = KafkaConfig {
            properties: properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..KafkaConfig::default()
        };
        let mut problems = Vec::new();
        let resolved = config.resolve(Path::new("."), &mut problems);
        (resolved, problems)
    }

    /// Regression: an empty inline secret was taken, and made the
    /// redactor of librdkafka's log lines panic on a `%`.
    #[test]
    fn an_empty_inline_secret_is_refused_by_name() {
        let (resolved, problems) = resolve(&[("ssl.key.password", ""), ("client.id", "")]);
        assert_eq!(
            problems,
            vec![
                "kafka.properties.\"ssl.key.password\" is empty: give the secret, as env:NAME or file:PATH, or remove the property"
            ]
        );
        assert!(resolved.secrets.is_empty(), "no empty needle is kept");
        assert_eq!(resolved.redact("100% done"), "100% done");
        let (_, problems) = resolve(&[("ssl.key.password", "hunter2")]);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn each_weakening_of_the_connection_is_named() {
        let weakened = |properties: &[(&str, &str)]| {
            let (resolved, problems) = resolve(properties);
            assert!(problems.is_empty(), "{problems:?}");
            resolved.weakened_security()
        };
        assert!(weakened(&[]).is_empty());
        assert!(
            weakened(&[
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", "PLAIN"),
                ("enable.ssl.certificate.verification", "true"),
                ("ssl.endpoint.identification.algorithm", "https"),
                (
                    "sasl.oauthbearer.token.endpoint.url",
                    "https://idp.example/token"
                ),
            ])
            .is_empty(),
            "a secured connection warns of nothing"
        );
        assert!(
            weakened(&[
                ("security.protocol", "sasl_plaintext"),
                ("sasl.mechanisms", "SCRAM-SHA-512")
            ])
            .is_empty(),
            "SCRAM does not send the password"
        );
        let all = weakened(&[
            ("enable.ssl.certificate.verification", "False"),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "PLAIN"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "HTTP://idp.internal/token",
            ),
        ]);
        let named: Vec<&str> = all.iter().map(|w| w.split(' ').next().unwrap()).collect();
        assert_eq!(
            named,
            vec![
                "kafka.properties.\"enable.ssl.certificate.verification\"",
                "kafka.properties.\"ssl.endpoint.identification.algorithm\"",
                "kafka.properties.\"security.protocol\"",
                "kafka.properties.\"sasl.oauthbearer.token.endpoint.url\"",
            ],
            "{all:?}"
        );
        assert!(all[2].contains("PLAIN"), "{}", all[2]);
        let single = weakened(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "plain"),
        ]);
        assert_eq!(single.len(), 1, "{single:?}");
    }
}
