//! Trace context through every hop (docs/tracing.md).
//!
//! Every record hopper writes carries exactly one W3C `traceparent`: the
//! trace id of the record it came from (or a new one, when that record had
//! none or an unusable one), and as its parent the span of the hop that
//! wrote it. `tracestate` travels with the trace it belongs to. The
//! producer's own parent span is not written again; it stays reachable as
//! [`Context::parent`].

pub mod context;
pub mod export;
pub mod spans;

pub use context::{
    Context, SpanId, TRACEPARENT, TRACEPARENT_LEN, TRACESTATE, TraceId, Traceparent,
    is_trace_header, parse_traceparent,
};
pub use export::{Span, Tracer};
pub use opentelemetry::trace::SpanKind;
