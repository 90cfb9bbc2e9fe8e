//! The spans of each kind of hop (docs/tracing.md), named and attributed by
//! the OpenTelemetry messaging conventions. Every function here returns at
//! its first branch when the trace is not exported.
//!
//! A route hop is a `process <topic>` span (the handler call; its parent is
//! the span that wrote the record read, which is also its link) and a
//! `send <topic>` span under it, whose id is the one written into the
//! `traceparent` of every record the hop produced. The next hop's call is
//! that span's child, so the spans of one message chain in hop order.

use crate::headers::{self, Reason};
use crate::hop::{Action, PlannedHop};
use crate::plugin::Verdict;
use crate::trace::{Span, Tracer};
use crate::traceparent::{Context, SpanId, parse_traceparent};
use opentelemetry::trace::SpanKind;
use rdkafka::message::{Headers, Message, OwnedMessage};

/// The spans of one route hop, from the record read to the records written.
#[derive(Default)]
pub struct RouteSpans {
    call: Option<Span>,
}

impl RouteSpans {
    /// Starts the call span of `message`, read by `group`, in `trace`.
    pub fn read(&mut self, tracer: &Tracer, trace: &Context, message: &OwnedMessage, group: &str) {
        let Some(mut span) = process_span(tracer, trace, message, Some(group)) else {
            return;
        };
        span.set("messaging.operation.name", "process");
        self.call = Some(span);
    }

    /// The context of the handler call: the call span's, or, when it is
    /// not exported, the hop's own (`trace`).
    pub fn call_context(&self, trace: &Context) -> Context {
        match &self.call {
            Some(span) => Context {
                span_id: span.id(),
                ..*trace
            },
            None => *trace,
        }
    }

    /// What the handler call was: its route, attempt, verdict, failure
    /// class and the handler version.
    pub fn handled(
        &mut self,
        route: &str,
        id: &str,
        attempt: u32,
        verdict: &Verdict,
        version: &str,
    ) {
        let Some(span) = &mut self.call else { return };
        let class = match verdict {
            Verdict::Ok => None,
            Verdict::Retryable { .. } => Some(Reason::Retryable),
            Verdict::Fatal { .. } => Some(Reason::Fatal),
            Verdict::Failed { class, .. } => Some(*class),
        };
        span.set("hopper.route", route.to_string());
        span.set("messaging.message.id", id.to_string());
        span.set("hopper.attempt", i64::from(attempt));
        span.set("hopper.verdict", verdict.kind().as_str());
        span.set("hopper.handler.version", version.to_string());
        if let Some(class) = class {
            span.set("hopper.reason", class.as_str());
            if class != Reason::Retryable {
                span.error(class.as_str());
            }
        }
    }

    /// Ends the call span and records the produce of what `action` writes.
    pub fn finish(self, tracer: &Tracer, action: &Action) {
        let Some(call) = self.call else { return };
        let parent = call.id();
        call.end();
        sent(tracer, Some(parent), action);
    }
}

/// The `send` span of the records `action` writes, with the span id their
/// `traceparent` carries: a hop writes all its records under one span.
/// `parent`: the call span, if any; else the span that wrote the record
/// read (from the `traceparent`'s trace).
pub fn sent(tracer: &Tracer, parent: Option<SpanId>, action: &Action) {
    if !tracer.is_on() {
        return;
    }
    let hops: &[PlannedHop] = match action {
        Action::Done | Action::After { .. } | Action::GiveUp => return,
        Action::Hop(hop) | Action::HopAt { hop, .. } => std::slice::from_ref(hop),
        Action::Hops(hops) => hops,
    };
    let Some(first) = hops.first() else { return };
    let Some(written) = written_by(first) else {
        return;
    };
    if written.flags & crate::traceparent::SAMPLED == 0 {
        return;
    }
    let all_one_topic = hops.iter().all(|h| h.record.topic == first.record.topic);
    let name = match all_one_topic {
        true => format!("send {}", first.record.topic),
        false => "send".to_string(),
    };
    let Some(mut span) = tracer.span(
        written.trace_id,
        written.span_id,
        parent,
        name,
        SpanKind::Producer,
    ) else {
        return;
    };
    span.set("messaging.system", "kafka");
    span.set("messaging.operation.type", "send");
    span.set("messaging.operation.name", "send");
    if all_one_topic {
        span.set("messaging.destination.name", first.record.topic.clone());
    }
    if hops.len() > 1 {
        span.set("messaging.batch.message_count", hops.len() as i64);
    }
    let h = Some(&first.record.headers);
    if let Ok(Some(reason)) = headers::text(h, headers::REASON) {
        span.set("hopper.reason", reason.to_string());
    }
    if let Ok(Some(trail)) = headers::text(h, headers::TRAIL) {
        span.set(
            "hopper.hop",
            trail.rsplit(',').next().unwrap_or("").to_string(),
        );
    }
    span.end();
}

/// The trace context written on a planned record.
fn written_by(hop: &PlannedHop) -> Option<crate::traceparent::Traceparent> {
    let value = hop
        .record
        .headers
        .iter()
        .find(|h| h.key == crate::traceparent::TRACEPARENT)?
        .value?;
    parse_traceparent(value)
}

/// The span of a delay-relay hop that moves a message down a tier (or
/// dead-letters it, or records a cancellation): its parent is the span that
/// wrote the record read.
pub fn relay_hop(tracer: &Tracer, trace: &Context, message: &OwnedMessage, action: &Action) {
    if !tracer.samples(trace) {
        return;
    }
    // A forward is reported when it is acknowledged (`forwarded`).
    if let Action::HopAt { .. } = action {
        return;
    }
    let hops: &[PlannedHop] = match action {
        Action::Hops(hops) => hops,
        Action::Hop(hop) => std::slice::from_ref(hop),
        _ => &[],
    };
    if hops.iter().any(|h| h.outcome.forward().is_some()) {
        return;
    }
    let Some(mut read) = process_span(tracer, trace, message, None) else {
        return;
    };
    read.set("hopper.route", crate::config::RELAY_ROUTE);
    let parent = read.id();
    read.end();
    sent(tracer, Some(parent), action);
}

/// The `process <topic>` span of `message` (read by `group`, if a group
/// reads it) in `trace`, linked to the span that wrote the record; `None`
/// when the trace is not exported.
fn process_span(
    tracer: &Tracer,
    trace: &Context,
    message: &OwnedMessage,
    group: Option<&str>,
) -> Option<Span> {
    // Before the name is formatted and an id drawn: with tracing off, or
    // the trace not sampled, a message pays one branch.
    if !tracer.samples(trace) {
        return None;
    }
    let mut span = tracer.span(
        trace.trace_id,
        SpanId::random(),
        trace.parent,
        format!("process {}", message.topic()),
        SpanKind::Consumer,
    )?;
    span.set("messaging.operation.type", "process");
    span.read_from(
        message.topic(),
        message.partition(),
        message.offset(),
        group,
    );
    span.link_parent(trace, "message");
    Some(span)
}
