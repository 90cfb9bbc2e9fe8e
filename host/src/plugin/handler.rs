//! One handler version and its calls: which instance a call runs in, and
//! how whatever the guest did becomes a [`Verdict`].

use super::bindings::{self, hopper::handler::types};
use super::emit::Emitted;
use super::grants::RouteGrants;
use super::instance::{Guest, Pool};
use super::output::LineBudget;
use super::state::GuestState;
use super::{Delivery, EpochTicker, Header, Message, TIMEOUT_GRACE, Verdict};
use crate::config::{InstancePolicy, Route, Secrets};
use crate::headers::{MAX_ERROR_BYTES, Reason};
use crate::per_thread::PerThread;
use futures::FutureExt;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::task::Poll;
use std::time::{Duration, Instant};
use wasmtime::{Engine, Store, Trap};

/// A compiled, validated handler version, cheap to clone. Calls made through
/// a clone keep using this version even after a newer one is loaded.
#[derive(Clone)]
pub struct Handler {
    inner: Arc<HandlerInner>,
}

struct HandlerInner {
    engine: Engine,
    /// Keeps the engine's epoch advancing while this version lives.
    _ticker: Arc<EpochTicker>,
    pre: bindings::HandlerPre<GuestState>,
    guest: Arc<GuestInfo>,
    timeout: Duration,
    memory_bytes: usize,
    policy: InstancePolicy,
    /// Idle warm instances; always empty under the fresh policy.
    pool: Pool,
    cached: bool,
    load_time: Duration,
}

/// The handler currently serving a route. Swapped whole on reload; a call
/// clones the `Handler` out, so calls in flight finish on the version they
/// started with.
///
/// Every thread reads its own copy ([`PerThread`]), each a separate `Arc`
/// of the same version: a call's clone and its drop touch only the calling
/// thread's cache lines. A reload writes every copy.
pub struct HandlerSlot {
    // std RwLock: held only to clone an Arc, never across an .await.
    current: PerThread<RwLock<Arc<Handler>>>,
}

impl HandlerSlot {
    pub fn new(handler: Handler) -> Self {
        Self {
            current: PerThread::new(|| RwLock::new(Arc::new(handler.clone()))),
        }
    }
    pub fn current(&self) -> Arc<Handler> {
        self.current.mine().read().unwrap().clone()
    }
    /// Serves `handler` from now on, and returns the version it replaces.
    pub fn swap(&self, handler: Handler) -> Handler {
        let mut old = None;
        for copy in self.current.all() {
            let was = std::mem::replace(&mut *copy.write().unwrap(), Arc::new(handler.clone()));
            old.get_or_insert_with(|| (*was).clone());
        }
        old.expect("at least one copy")
    }
}

/// What the host functions know about the guest they serve.
pub(super) struct GuestInfo {
    pub(super) route: String,
    pub(super) handler: String,
    pub(super) version: String,
    pub(super) short_version: String,
    pub(super) config: BTreeMap<String, String>,
    pub(super) budget: LineBudget,
    /// The route's grants, shared by every version of its handler.
    pub(super) grants: Arc<RouteGrants>,
}

/// What one handler call came to: the verdict, and the records the handler
/// emitted, which the route produces only on `ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub verdict: Verdict,
    /// The records to produce: empty unless the verdict is `ok`.
    pub emitted: Vec<Emitted>,
    /// Records the handler emitted that are dropped because the verdict is
    /// not `ok`.
    pub discarded: usize,
}

impl Handler {
    pub(super) fn new(
        (engine, ticker): (Engine, Arc<EpochTicker>),
        pre: bindings::HandlerPre<GuestState>,
        guest: GuestInfo,
        route: &Route,
        (cached, load_time): (bool, Duration),
    ) -> Handler {
        Handler {
            inner: Arc::new(HandlerInner {
                engine,
                _ticker: ticker,
                pre,
                guest: Arc::new(guest),
                timeout: route.timeout,
                memory_bytes: route.memory_bytes,
                policy: route.instance,
                pool: Pool::new(route.max_instances),
                cached,
                load_time,
            }),
        }
    }

    /// This version under another route's grants, limits and config.
    pub(super) fn rebound(&self, grants: Arc<RouteGrants>, route: &Route) -> Handler {
        let inner = &*self.inner;
        let guest = &inner.guest;
        Handler::new(
            (inner.engine.clone(), inner._ticker.clone()),
            inner.pre.clone(),
            GuestInfo {
                route: route.name.clone(),
                handler: guest.handler.clone(),
                version: guest.version.clone(),
                short_version: guest.short_version.clone(),
                config: route.config.clone(),
                budget: LineBudget::new(),
                grants,
            },
            route,
            (inner.cached, inner.load_time),
        )
    }

    /// File stem of the handler, for example `order_timeout`.
    pub fn name(&self) -> &str {
        &self.inner.guest.handler
    }

    /// sha256 of the component file, in hex.
    pub fn version(&self) -> &str {
        &self.inner.guest.version
    }

    /// Whether loading took the compiled artifact from the cache, and how
    /// long loading took.
    pub fn load_stats(&self) -> (bool, Duration) {
        (self.inner.cached, self.inner.load_time)
    }

    /// Calls the guest once and returns only its verdict; records it
    /// emitted are dropped. For tools that check verdicts.
    pub async fn call(&self, delivery: Delivery) -> Verdict {
        self.run(delivery).await.verdict
    }

    /// Calls the guest once with `delivery`, as [`Handler::run_message`].
    pub async fn run(&self, delivery: Delivery) -> Answer {
        let headers: Vec<Header<'_>> = delivery
            .headers
            .iter()
            .map(|(key, value)| Header { key, value })
            .collect();
        self.run_message(&Message {
            id: &delivery.id,
            topic: &delivery.topic,
            partition: delivery.partition,
            offset: delivery.offset,
            key: delivery.key.as_deref(),
            payload: delivery.payload.as_deref(),
            headers: &headers,
            timestamp: delivery.timestamp,
            attempt: delivery.attempt,
            route: &delivery.route,
        })
        .await
    }

    /// Calls the guest once: in a fresh instance, or in a warm one when the
    /// route's policy allows and one is idle.
    pub async fn run_message(&self, message: &Message<'_>) -> Answer {
        let inner = &*self.inner;
        let mut guest = match inner.policy {
            InstancePolicy::Warm { .. } => inner.pool.take(),
            InstancePolicy::Fresh => None,
        }
        .unwrap_or_else(|| Guest::new(&inner.engine, &inner.guest, inner.memory_bytes));
        let started = Instant::now();
        guest.begin(started + inner.timeout, message.id);

        // A host function that panics on what the guest passed it unwinds
        // out of the call. It costs this message a HANDLER_TRAP and the
        // instance, never the process: `catch_unwind` stops it here, and a
        // failed call's instance is never entered again.
        let call = AssertUnwindSafe(guest.call(&inner.pre, message)).catch_unwind();
        let result = {
            let mut call = std::pin::pin!(call);
            // The epoch deadline stops guest code; the wall-clock timeout
            // also covers time spent inside host calls, which epochs do not
            // interrupt. A call that ends in its first poll waited on no
            // host call, so it needs no timer: arming one would cost more
            // than a no-op call. Any other call gets the timeout, counted
            // from the start of the call.
            match futures::poll!(call.as_mut()) {
                Poll::Ready(result) => Ok(result),
                Poll::Pending => {
                    let limit = started + inner.timeout + TIMEOUT_GRACE;
                    tokio::time::timeout_at(limit.into(), call).await
                }
            }
        };
        let state = guest.store.data_mut();
        let emitted = state.emits.take();
        let stderr_summary = state.flush_output();
        let secrets = &inner.guest.grants.config.secrets;
        let verdict = match result {
            Err(_) => Verdict::Failed {
                class: Reason::HandlerTimeout,
                error: format!("handler ran past its {:?} limit", inner.timeout),
            },
            Ok(Err(panic)) => Verdict::Failed {
                class: Reason::HandlerTrap,
                error: format!(
                    "the host failed serving one of the handler's calls: {}",
                    panic_message(&*panic)
                ),
            },
            Ok(Ok(Ok(outcome))) => from_wit(outcome, secrets),
            Ok(Ok(Err(error))) => classify(&error, &guest.store, stderr_summary, inner.timeout),
        };
        // Only a guest whose call returned may be entered again.
        if let InstancePolicy::Warm { max_calls } = inner.policy
            && !matches!(verdict, Verdict::Failed { .. })
            && guest.calls < max_calls
        {
            inner.pool.put(guest);
        }
        if verdict == Verdict::Ok {
            Answer {
                verdict,
                emitted,
                discarded: 0,
            }
        } else {
            Answer {
                verdict,
                emitted: Vec::new(),
                discarded: emitted.len(),
            }
        }
    }
}

/// The text a panic was raised with, cut to a bound: it goes into a header.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    crate::headers::shorten(text, 512)
}

fn classify(
    error: &wasmtime::Error,
    store: &Store<GuestState>,
    stderr_summary: Option<String>,
    timeout: Duration,
) -> Verdict {
    if let Some(denied) = store.data().limits.denied {
        return Verdict::Failed {
            class: Reason::HandlerMemory,
            error: format!(
                "handler tried to grow its memory to {denied} bytes; the route's cap is {} bytes",
                store.data().limits.cap
            ),
        };
    }
    let trap = error.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return Verdict::Failed {
            class: Reason::HandlerTimeout,
            error: format!("handler ran past its {timeout:?} limit"),
        };
    }
    let mut text = match trap {
        Some(trap) => format!("trap: {trap}"),
        // Not a trap of the guest's own: an error wasmtime raised on the
        // guest's behalf, such as a `string` argument that is not UTF-8.
        // Its outermost context is a wasm backtrace, several lines that
        // start "error while executing"; the innermost error says what.
        None => error
            .root_cause()
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    if let Some(line) = stderr_summary {
        text.push_str("; guest stderr: ");
        text.push_str(&line);
    }
    Verdict::Failed {
        class: Reason::HandlerTrap,
        error: text,
    }
}

/// The verdict of an outcome. A reason that quotes a secret's value gets
/// the secret's name in its place: reasons go into logs and headers. It is
/// cut to the header's [`MAX_ERROR_BYTES`] before it is redacted, so a
/// guest's megabytes of reason cost the host no more than that.
fn from_wit(outcome: types::Outcome, secrets: &Secrets) -> Verdict {
    let redact = |reason: String| match secrets.redact_within(&reason, MAX_ERROR_BYTES) {
        Cow::Borrowed(_) => reason,
        Cow::Owned(redacted) => redacted,
    };
    match outcome {
        types::Outcome::Ok => Verdict::Ok,
        types::Outcome::Retryable(f) => Verdict::Retryable {
            reason: redact(f.reason),
            retry_after: f.retry_after_ms.map(Duration::from_millis),
        },
        types::Outcome::Fatal(f) => Verdict::Fatal {
            reason: redact(f.reason),
        },
    }
}
