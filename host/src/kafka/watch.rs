//! What the clients' own errors tell about the connection to Kafka.
//!
//! librdkafka reports a failed connection through each client's error
//! callback and its log, and retries on its own for ever. An authentication
//! or TLS failure never heals by retrying, so hopper turns it into facts an
//! operator acts on:
//! - before anything starts, [`super::Cluster::check_connection`] fails
//!   within [`CONNECT_DEADLINE`] with one line naming the cause;
//! - after start (a credential rotated away, a certificate expired), the
//!   [`ConnectionWatch`] counts each failure
//!   (`hopper_kafka_auth_failures_total`), logs the cause at most once a
//!   minute, and makes `/ready` false until a connection succeeds again.
//!
//! Every line that librdkafka logs or reports through a watched client has
//! the `[kafka]` table's secrets replaced ([`crate::config::KafkaConfig::redact`]).

use crate::clock::now_ms;
use crate::config::Secrets;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long the check before start waits for a broker to answer.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(20);
/// A failing connection is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// A connection failure that retrying does not heal, in words an operator
/// can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What failed and what to check.
    pub cause: String,
}

/// Classifies a client error: `Some` for an authentication or TLS failure,
/// or a plaintext client talking to a TLS listener; `None` for what
/// librdkafka heals by retrying (a broker restarting, a timeout).
///
/// `tls` says whether the client speaks TLS (`security.protocol` `ssl` or
/// `sasl_ssl`). A connection such a client had set up, closed by the broker
/// during the first request, is what a broker going away looks like (a
/// restart, a rolling upgrade): TLS was spoken, so it is no evidence of a
/// plaintext client, and it is left to librdkafka's retries.
pub fn failure_of(error: &KafkaError, reason: &str, tls: bool) -> Option<Failure> {
    let verify_failed = |reason: &str| {
        format!(
            "TLS failed: {reason}; check ssl.ca.location (the broker's CA) and, for mutual TLS, ssl.certificate.location, ssl.key.location and the certificate's dates"
        )
    };
    let code = error.rdkafka_error_code()?;
    let lower = reason.to_ascii_lowercase();
    let cause = match code {
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
            format!(
                "authentication failed: {reason}; check sasl.mechanism, sasl.username and sasl.password (or the OAUTHBEARER settings)"
            )
        }
        RDKafkaErrorCode::UnsupportedSASLMechanism | RDKafkaErrorCode::IllegalSASLState => {
            format!("the broker refused the SASL mechanism: {reason}; check sasl.mechanism")
        }
        // The client could not verify the broker's certificate. librdkafka
        // reports it as an SSL error or, as often, a transport failure
        // carrying OpenSSL's "certificate verify failed".
        RDKafkaErrorCode::SSL if lower.contains("verify") || lower.contains("certificate") => {
            verify_failed(reason)
        }
        RDKafkaErrorCode::BrokerTransportFailure if lower.contains("certificate verify failed") => {
            verify_failed(reason)
        }
        RDKafkaErrorCode::SSL => {
            format!("TLS failed: {reason}; check security.protocol and the ssl.* settings")
        }
        RDKafkaErrorCode::BrokerTransportFailure
            if lower.contains("ssl routines") || lower.contains("ssl alert") =>
        {
            format!(
                "TLS failed: {reason}; the broker refused the handshake: check ssl.certificate.location and ssl.key.location (the client certificate it demands, signed by a CA it trusts, within its dates)"
            )
        }
        RDKafkaErrorCode::BrokerTransportFailure
            if !tls
                && (lower.contains("security.protocol")
                    || (lower.contains("disconnected") && lower.contains("apiversion_query"))) =>
        {
            format!(
                "the broker closed the connection at the first request: {reason}; is this a plaintext client on a TLS listener? check security.protocol"
            )
        }
        _ => return None,
    };
    Some(Failure { cause })
}

/// The connection's state as every watched client reports it. One per
/// hopper; `Health` holds it.
#[derive(Default)]
pub struct ConnectionWatch {
    secrets: OnceLock<Secrets>,
    /// Whether the clients speak TLS ([`failure_of`]'s `tls`).
    tls: std::sync::atomic::AtomicBool,
    /// Set once a short-lived command checked the connection
    /// ([`ConnectionWatch::checked`]).
    checked: std::sync::atomic::AtomicBool,
    failures: AtomicU64,
    /// When the current failure began, epoch ms; 0 when none.
    failing_since: AtomicI64,
    last_logged: AtomicI64,
    cause: Mutex<Option<String>>,
}

impl ConnectionWatch {
    /// The `[kafka]` secrets to keep out of what is logged; set once.
    pub fn set_secrets(&self, secrets: Secrets) {
        let _ = self.secrets.set(secrets);
    }

    /// Whether the clients speak TLS: set once, from `security.protocol`.
    pub fn set_tls(&self, tls: bool) {
        self.tls.store(tls, Relaxed);
    }

    /// Whether the clients speak TLS.
    pub fn tls(&self) -> bool {
        self.tls.load(Relaxed)
    }

    /// A short-lived command (the CLI's) checked the connection before it
    /// began: the brokers answered and took the credentials. From then on,
    /// what its clients report that retrying heals, or that a connection
    /// lost while authenticating says (a group coordinator's connection cut
    /// short as a reader closes), is logged at debug: the command's own
    /// result says whether it worked, and such a line, printed by a command
    /// that succeeded, would read as its failure. A credential or
    /// certificate refused is still logged as such.
    pub fn checked(&self) {
        self.checked.store(true, Relaxed);
    }

    fn is_checked(&self) -> bool {
        self.checked.load(Relaxed)
    }

    /// `text` with the `[kafka]` secrets replaced.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match self.secrets.get() {
            Some(secrets) => secrets.redact(text),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// A client's error callback: a failure that retrying does not heal is
    /// counted, and logged if none was in the last minute; anything else is
    /// logged as librdkafka would, with the secrets replaced.
    pub fn error(&self, client: &str, error: &KafkaError, reason: &str) {
        self.report(client, error, reason, false);
    }

    /// [`ConnectionWatch::error`]; with `quiet`, what is not a connection
    /// failure is logged at debug: an error the client expects.
    fn report(&self, client: &str, error: &KafkaError, reason: &str, quiet: bool) {
        let reason = self.redact(reason);
        let cut_short =
            self.is_checked() && reason.to_ascii_lowercase().contains("transport failure");
        let failure = failure_of(error, &reason, self.tls()).filter(|_| !cut_short);
        let Some(failure) = failure else {
            if quiet || self.is_checked() {
                tracing::debug!(target: "librdkafka", client, error = %error, "{reason}");
            } else {
                tracing::error!(target: "librdkafka", client, error = %error, "{reason}");
            }
            return;
        };
        self.failures.fetch_add(1, Relaxed);
        let now = now_ms();
        let _ = self
            .failing_since
            .compare_exchange(0, now, Relaxed, Relaxed);
        *self.cause.lock().unwrap() = Some(failure.cause.clone());
        let last = self.last_logged.load(Relaxed);
        if (last == 0 || now - last >= LOG_EVERY.as_millis() as i64)
            && self
                .last_logged
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            tracing::error!(
                client,
                failures = self.failures(),
                "Cannot connect to Kafka: {} (logged at most once a minute; /ready is false until a connection succeeds)",
                failure.cause
            );
        }
    }

    /// A client's log line: redacted, and dropped when it repeats a failure
    /// the error callback reports.
    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let message = self.redact(message);
        if fac == "FAIL" {
            // A TLS alert or a connection closed at the first request is
            // only logged by librdkafka, never reported as an error.
            let transport = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
            if failure_of(&transport, &message, self.tls()).is_some() {
                return self.report("librdkafka", &transport, &message, false);
            }
            if self.failing().is_some() {
                return;
            }
        }
        if self.is_checked() && (level as i32) <= (RDKafkaLogLevel::Warning as i32) {
            tracing::debug!(target: "librdkafka", fac, "{message}");
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", fac, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", fac, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    /// Authentication and TLS failures seen since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// The cause of the current failure, while the connection fails.
    pub fn failing(&self) -> Option<String> {
        if self.failing_since.load(Relaxed) == 0 {
            return None;
        }
        self.cause.lock().unwrap().clone()
    }

    /// A connection succeeded: the failure, if any, is over.
    pub fn recovered(&self) {
        if self.failing_since.swap(0, Relaxed) != 0 {
            *self.cause.lock().unwrap() = None;
            self.last_logged.store(0, Relaxed);
            tracing::info!("Connected to Kafka again.");
        }
    }
}

/// The client context of hopper's short-lived clients (metadata, admin,
/// lag, the CLI's): errors and log lines go through a [`ConnectionWatch`].
#[derive(Clone)]
pub struct WatchedContext {
    pub(crate) name: &'static str,
    pub(crate) watch: Arc<ConnectionWatch>,
    pub(crate) quiet: bool,
}

impl WatchedContext {
    /// The same context, for a client that expects errors of its records
    /// (`hopper skip`'s probes): those are logged at debug only.
    pub fn quiet(self) -> WatchedContext {
        WatchedContext {
            quiet: true,
            ..self
        }
    }
}

impl ClientContext for WatchedContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.watch.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.watch.report(self.name, &error, reason, self.quiet);
    }
}

impl rdkafka::consumer::ConsumerContext for WatchedContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_that_retrying_cannot_heal_are_named_and_the_rest_are_not() {
        let auth = KafkaError::Global(RDKafkaErrorCode::Authentication);
        let failure = failure_of(&auth, "SASL authentication error: bad password", false).unwrap();
        assert!(
            failure.cause.contains("authentication failed"),
            "{failure:?}"
        );
        assert!(failure.cause.contains("sasl.password"), "{failure:?}");
        let tls = KafkaError::Global(RDKafkaErrorCode::SSL);
        let failure = failure_of(
            &tls,
            "SSL handshake failed: certificate verify failed",
            false,
        )
        .unwrap();
        assert!(failure.cause.contains("ssl.ca.location"), "{failure:?}");
        let plain = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        let failure = failure_of(&plain, "Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration", false)
        .unwrap();
        assert!(failure.cause.contains("plaintext client on a TLS listener"));
        let closed = "Disconnected: connection closed by peer: receive 0 after POLLIN (after 0ms in state APIVERSION_QUERY)";
        assert!(failure_of(&plain, closed, false).is_some());
        let alert = "Receive failed: error:0A00045C:SSL routines::tlsv13 alert certificate required: SSL alert number 116";
        assert!(
            failure_of(&plain, alert, false)
                .unwrap()
                .cause
                .contains("ssl.certificate.location")
        );
        // The same verification failure, reported as a transport failure
        // (seen when the broker's CA is not the one configured).
        let unverified = "sasl_ssl://127.0.0.1:1/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 1ms in state SSL_HANDSHAKE)";
        let cause = failure_of(&plain, unverified, false).unwrap().cause;
        assert!(cause.contains("ssl.ca.location"), "{cause}");
        assert!(
            !cause.contains("the broker refused the handshake"),
            "{cause}"
        );
        assert_eq!(failure_of(&plain, "Connection refused", false), None);
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(failure_of(&down, "1/1 brokers are down", false), None);
    }

    #[test]
    fn a_failure_is_counted_until_a_connection_succeeds() {
        let watch = ConnectionWatch::default();
        assert_eq!(watch.failing(), None);
        let auth = KafkaError::Global(RDKafkaErrorCode::Authentication);
        watch.error("test", &auth, "SASL authentication error");
        watch.error("test", &auth, "SASL authentication error");
        assert_eq!(watch.failures(), 2);
        assert!(watch.failing().unwrap().contains("authentication failed"));
        watch.recovered();
        assert_eq!(watch.failing(), None);
        assert_eq!(watch.failures(), 2, "the counter only grows");
    }

    #[test]
    fn what_a_client_reports_has_the_secrets_replaced() {
        let watch = ConnectionWatch::default();
        let mut secrets = Secrets::default();
        secrets.insert("sasl.password", "hunter2-s3cret".into());
        watch.set_secrets(secrets);
        assert_eq!(
            watch.redact("login with hunter2-s3cret failed"),
            "login with [secret sasl.password] failed"
        );
    }
}
