//! Trace context through every hop (docs/tracing.md).
//!
//! Every record hopper writes carries exactly one W3C `traceparent`: the
//! trace id of the record it came from (or a new one, when that record had
//! none or an unusable one), and as its parent the span of the hop that
//! wrote it. `tracestate` travels with the trace it belongs to. The
//! producer's own parent span is not written again; it stays reachable as
//! [`Context::parent`].

pub mod export;
pub mod logs;

use crate::traceparent::{Context, TRACEPARENT};
pub use export::{ExportError, Span, Tracer};
pub use opentelemetry::trace::SpanKind;

tokio::task_local! {
    /// The trace context of the handler call running on this task: what a
    /// guest's outbound HTTP request carries (`plugin::http`).
    static CALL: Context;
}

/// Runs a handler call `call` with `trace` as its context: a request the
/// guest sends through `wasi:http` while it runs gets `trace`'s
/// `traceparent`. The guest's code runs inside this future's poll, on this
/// task, so the context reaches the host's HTTP hook without being passed
/// through the call.
pub async fn in_call<F: std::future::Future>(trace: Context, call: F) -> F::Output {
    CALL.scope(trace, call).await
}

/// The trace context of the handler call running on this task, if any.
pub fn current_call() -> Option<Context> {
    CALL.try_with(|trace| *trace).ok()
}

/// Adds the current call's `traceparent` to a guest's outbound request,
/// unless the guest set one itself.
pub fn propagate(headers: &mut http::HeaderMap) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let Some(trace) = current_call() else { return };
    let value = http::HeaderValue::from_bytes(&trace.traceparent())
        .expect("a traceparent is visible ASCII");
    headers.insert(TRACEPARENT, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_guests_request_gets_the_calls_traceparent_unless_it_has_one() {
        let call = Context::root();
        let mut outside = http::HeaderMap::new();
        propagate(&mut outside);
        assert!(outside.is_empty(), "no call, no header");
        let (plain, own) = in_call(call, async {
            let mut plain = http::HeaderMap::new();
            propagate(&mut plain);
            let mut own = http::HeaderMap::new();
            own.insert("TraceParent", http::HeaderValue::from_static("mine"));
            propagate(&mut own);
            (plain, own)
        })
        .await;
        assert_eq!(plain[TRACEPARENT].as_bytes(), &call.traceparent()[..]);
        assert_eq!(own.get_all(TRACEPARENT).iter().count(), 1);
        assert_eq!(own[TRACEPARENT], "mine");
    }
}
