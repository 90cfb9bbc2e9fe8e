//! A handler's events: its calls, its reloads, its HTTP requests, and the
//! records it emitted that were dropped.
//!
//! [`Handled`], [`HttpRequest`] and [`HttpDenied`] happen on a message's
//! path, so they follow the hot-path rule (no lock, no lookup, no
//! formatting per message): each has a registered handle, [`Calls`] and
//! [`HttpCounters`], that holds its counters from the start, writes its log
//! line, and builds the event's type only when someone observes, as
//! vector's registered events do.

use super::{InternalEvent, Telemetry, short};
use crate::metrics::series::{self, HandlerOutcomes, HttpRequests, MessagesConsumed};
use crate::metrics::{Counter, Histogram, Metrics};
use crate::types::VerdictKind;
use std::time::{Duration, Instant};

/// A handler call finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub route: String,
    pub id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub attempt: u32,
    pub verdict: VerdictKind,
    /// sha256 of the handler version that ran.
    pub version: String,
    pub at_ms: i64,
}

impl InternalEvent for Handled {
    fn record(&self, metrics: &Metrics) {
        let (route, outcome) = (&self.route, self.verdict.as_str());
        metrics.inc(&HandlerOutcomes { route, outcome });
    }
}

/// One call as [`Calls::handled`] reports it: borrowed from the message
/// and the verdict, so that reporting it allocates nothing.
pub struct Call<'a> {
    pub id: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub attempt: u32,
    pub verdict: VerdictKind,
    /// The class and error of a call that failed: a trap, a timeout, out
    /// of memory.
    pub failure: Option<(&'a str, &'a str)>,
    /// sha256 of the handler version that ran.
    pub version: &'a str,
    pub trace_id: crate::traceparent::TraceId,
}

/// The registered handle of a route's calls: its consumed and outcome
/// counters and its call-duration histogram, held from the route's start.
#[derive(Clone)]
pub struct Calls {
    route: String,
    /// `None` with metrics off.
    consumed: Option<Counter>,
    /// By verdict kind, in the order of [`VerdictKind::ALL`].
    outcomes: [Counter; VerdictKind::ALL.len()],
    /// `None` with metrics off: the call is then not timed at all.
    duration: Option<Histogram>,
}

impl Calls {
    /// Registers the series of `route`'s calls; once per route, at start.
    pub fn register(metrics: &Metrics, route: &str) -> Calls {
        Calls {
            route: route.to_string(),
            consumed: metrics
                .enabled()
                .then(|| metrics.handle(&MessagesConsumed { route })),
            outcomes: VerdictKind::ALL.map(|kind| {
                let outcome = kind.as_str();
                metrics.handle(&HandlerOutcomes { route, outcome })
            }),
            duration: metrics.call_duration(route),
        }
    }

    /// A message was read.
    pub fn consumed(&self) {
        if let Some(consumed) = &self.consumed {
            consumed.inc();
        }
    }

    /// When a call starts, if calls are timed.
    pub fn started(&self) -> Option<Instant> {
        self.duration.as_ref().map(|_| Instant::now())
    }

    /// A call that started at `started` ([`Calls::started`]) finished:
    /// times and counts it, logs it, and sends [`Handled`] to observers.
    pub fn handled(&self, telemetry: &Telemetry, started: Option<Instant>, call: Call<'_>) {
        if let (Some(histogram), Some(started)) = (&self.duration, started) {
            histogram.observe(started.elapsed());
        }
        self.outcomes[call.verdict as usize].inc();
        let route = &self.route;
        tracing::debug!(
            route,
            id = call.id,
            version = short(call.version),
            topic = call.topic,
            partition = call.partition,
            offset = call.offset,
            attempt = call.attempt,
            verdict = call.verdict.as_str(),
            trace_id = %call.trace_id,
            "Message handled."
        );
        if let Some((class, error)) = call.failure {
            tracing::warn!(
                route,
                id = call.id,
                attempt = call.attempt,
                version = short(call.version),
                class,
                error,
                trace_id = %call.trace_id,
                "Handler call failed."
            );
        }
        if telemetry.has_observers() {
            telemetry.publish(Handled {
                route: route.clone(),
                id: call.id.to_string(),
                topic: call.topic.to_string(),
                partition: call.partition,
                offset: call.offset,
                attempt: call.attempt,
                verdict: call.verdict,
                version: call.version.to_string(),
                at_ms: crate::clock::now_ms(),
            });
        }
    }
}

/// A new handler version is serving the route. Calls already running
/// finish on the old one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerReloaded {
    pub route: String,
    pub handler: String,
    /// sha256 of the version that served until now.
    pub old_version: String,
    /// sha256 of the version that serves from now on.
    pub new_version: String,
    /// From the first file event of the change to the swap.
    pub took: Duration,
    /// The compiled artifact came from the cache; nothing was compiled.
    pub cached: bool,
}

impl InternalEvent for HandlerReloaded {
    fn record(&self, metrics: &Metrics) {
        tracing::info!(
            route = self.route,
            handler = self.handler,
            old_version = short(&self.old_version),
            new_version = short(&self.new_version),
            took_ms = self.took.as_secs_f64() * 1000.0,
            cached = self.cached,
            "Handler reloaded."
        );
        let route = &self.route;
        metrics.inc(&series::HandlerReloads {
            route,
            result: "ok",
        });
    }
}

/// A changed handler file could not be loaded; the old version keeps
/// serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerReloadFailed {
    pub route: String,
    /// sha256 of the version that keeps serving.
    pub version: String,
    pub error: String,
}

impl InternalEvent for HandlerReloadFailed {
    fn record(&self, metrics: &Metrics) {
        tracing::error!(
            route = self.route,
            serving_version = short(&self.version),
            error = self.error,
            "Handler reload failed; the old version keeps serving."
        );
        let route = &self.route;
        metrics.inc(&series::HandlerReloads {
            route,
            result: "failed",
        });
    }
}

/// A handler's HTTP request got a response head, or failed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub route: String,
    /// The handler's name.
    pub handler: String,
    /// The message being handled.
    pub id: String,
    /// sha256 of the handler version that sent it.
    pub version: String,
    pub method: String,
    /// `scheme://authority/path`: no query, secrets redacted.
    pub url: String,
    /// The response status; `None` when no response came.
    pub status: Option<u16>,
    /// Why no response came.
    pub error: Option<String>,
    /// From sending the request to its response head.
    pub took: Duration,
    /// How long it waited for its turn under its host's limits
    /// (`http.hosts`) before it was sent; `None` for a host without limits.
    pub waited: Option<Duration>,
}

impl HttpRequest {
    fn log(&self) {
        tracing::debug!(
            route = self.route,
            handler = self.handler,
            version = short(&self.version),
            id = self.id,
            method = self.method,
            url = self.url,
            status = self.status,
            error = self.error,
            took_ms = self.took.as_secs_f64() * 1000.0,
            waited_ms = self.waited.map(|w| w.as_secs_f64() * 1000.0),
            "HTTP request sent."
        );
    }
}

impl InternalEvent for HttpRequest {
    fn record(&self, metrics: &Metrics) {
        self.log();
        let (route, result) = (&self.route, STATUS_CLASSES[status_class(self.status)]);
        metrics.inc(&HttpRequests { route, result });
    }
}

/// A handler's HTTP request was refused by the route's grants: a host not
/// in `allowed_hosts`, a guarded address, or one request past
/// `http.max_requests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpDenied {
    pub route: String,
    pub handler: String,
    pub id: String,
    pub version: String,
    pub method: String,
    pub url: String,
    pub reason: String,
    /// Refused by the mode of a candidate's try, not by the route's
    /// grants: logged at debug, since the try says so once.
    pub expected: bool,
}

impl HttpDenied {
    fn log(&self) {
        if self.expected {
            tracing::debug!(
                route = self.route,
                handler = self.handler,
                version = short(&self.version),
                id = self.id,
                method = self.method,
                url = self.url,
                reason = self.reason,
                "HTTP request denied."
            );
            return;
        }
        tracing::warn!(
            route = self.route,
            handler = self.handler,
            version = short(&self.version),
            id = self.id,
            method = self.method,
            url = self.url,
            reason = self.reason,
            "HTTP request denied."
        );
    }
}

impl InternalEvent for HttpDenied {
    fn record(&self, metrics: &Metrics) {
        self.log();
        let route = &self.route;
        metrics.inc(&HttpRequests {
            route,
            result: "denied",
        });
    }
}

/// A handler's HTTP request waited for its turn under its host's limits
/// (`http.hosts`) until its call's deadline came, or its turn under `rate`
/// would have come after it, and was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimited {
    pub route: String,
    pub handler: String,
    pub id: String,
    pub version: String,
    pub method: String,
    pub url: String,
    /// The entry and the limit it waited for, and how long.
    pub reason: String,
    pub waited: Duration,
}

impl HttpLimited {
    fn log(&self) {
        tracing::warn!(
            route = self.route,
            handler = self.handler,
            version = short(&self.version),
            id = self.id,
            method = self.method,
            url = self.url,
            reason = self.reason,
            waited_ms = self.waited.as_secs_f64() * 1000.0,
            "HTTP request not sent: its host's limit held it past the call's deadline."
        );
    }
}

impl InternalEvent for HttpLimited {
    fn record(&self, metrics: &Metrics) {
        self.log();
        let route = &self.route;
        metrics.inc(&HttpRequests {
            route,
            result: "limited",
        });
    }
}

/// Result labels of `hopper_http_requests_total` for requests that were
/// sent: a status class, then `error` for no response.
pub const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// The place in [`STATUS_CLASSES`] of a response status, or of none.
fn status_class(status: Option<u16>) -> usize {
    match status {
        Some(s @ 100..=599) => usize::from(s / 100) - 1,
        _ => 5,
    }
}

/// The registered handle of a route's HTTP requests, held by its grants.
pub struct HttpCounters {
    /// By [`STATUS_CLASSES`].
    answered: [Counter; 6],
    denied: Counter,
    /// Not sent: held by a host's limits past the call's deadline.
    limited: Counter,
}

impl HttpCounters {
    /// Registers the series of `route`'s requests.
    pub fn register(metrics: &Metrics, route: &str) -> HttpCounters {
        HttpCounters {
            answered: STATUS_CLASSES.map(|result| metrics.handle(&HttpRequests { route, result })),
            denied: metrics.handle(&HttpRequests {
                route,
                result: "denied",
            }),
            limited: metrics.handle(&HttpRequests {
                route,
                result: "limited",
            }),
        }
    }

    /// A request got a response head with `status`, or none. Counted at
    /// once; the event (which allocates) is made, logged and sent only when
    /// debug logging is on or someone observes.
    pub fn answered(
        &self,
        telemetry: &Telemetry,
        status: Option<u16>,
        event: impl FnOnce() -> HttpRequest,
    ) {
        self.answered[status_class(status)].inc();
        let observed = telemetry.has_observers();
        if !(observed || tracing::enabled!(tracing::Level::DEBUG)) {
            return;
        }
        let event = event();
        event.log();
        if observed {
            telemetry.publish(event);
        }
    }

    /// A request was refused. Counted at once; logged when warnings (debug,
    /// for an `expected` refusal) are on
    /// and `budget` allows one more line (so a guest that loops on a denied
    /// URL cannot flood the log); the event is made only when it is logged
    /// or observed.
    pub fn denied(
        &self,
        telemetry: &Telemetry,
        expected: bool,
        budget: impl FnOnce() -> bool,
        event: impl FnOnce() -> HttpDenied,
    ) {
        self.denied.inc();
        let observed = telemetry.has_observers();
        let enabled = if expected {
            tracing::enabled!(tracing::Level::DEBUG)
        } else {
            tracing::enabled!(tracing::Level::WARN)
        };
        let logged = enabled && budget();
        if !(logged || observed) {
            return;
        }
        let event = event();
        if logged {
            event.log();
        }
        if observed {
            telemetry.publish(event);
        }
    }

    /// A request was held by its host's limits past its call's deadline.
    /// Counted at once; logged as a warning within `budget`, like a
    /// refusal.
    pub fn limited(
        &self,
        telemetry: &Telemetry,
        budget: impl FnOnce() -> bool,
        event: impl FnOnce() -> HttpLimited,
    ) {
        self.limited.inc();
        let observed = telemetry.has_observers();
        let logged = tracing::enabled!(tracing::Level::WARN) && budget();
        if !(logged || observed) {
            return;
        }
        let event = event();
        if logged {
            event.log();
        }
        if observed {
            telemetry.publish(event);
        }
    }
}

/// Records a handler emitted were dropped, because its verdict was not
/// `ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmitsDiscarded {
    pub route: String,
    /// The message whose call emitted them.
    pub id: String,
    pub count: usize,
    pub verdict: VerdictKind,
}

impl InternalEvent for EmitsDiscarded {
    fn record(&self, metrics: &Metrics) {
        tracing::debug!(
            route = self.route,
            id = self.id,
            count = self.count,
            verdict = self.verdict.as_str(),
            "Emitted records discarded: the verdict is not ok."
        );
        let route = &self.route;
        let discarded = series::EmittedRecords {
            route,
            result: "discarded",
        };
        metrics.inc_by(&discarded, self.count as u64);
    }
}
