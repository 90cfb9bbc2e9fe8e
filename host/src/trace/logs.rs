//! JSON log lines that carry the trace: a line logged while a handler call
//! runs (the guest's own logs, its HTTP requests, its emits) gets the
//! call's `trace_id` and `span_id` (docs/operations.md, logs).

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps a JSON event format: within a handler call, the object gets
/// `trace_id` and `span_id` first; elsewhere the line is the inner
/// format's, unchanged.
pub struct WithTrace<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for WithTrace<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let Some(call) = super::current_call() else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                let close = if rest.trim_start().starts_with('}') {
                    ""
                } else {
                    ","
                };
                write!(
                    writer,
                    "{{\"trace_id\":\"{}\",\"span_id\":\"{}\"{close}{rest}",
                    call.trace_id, call.span_id
                )
            }
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Context, in_call};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_line_logged_in_a_call_carries_its_trace() {
        let lines = Lines::default();
        let writer = lines.clone();
        let format = tracing_subscriber::fmt::format().json().flatten_event(true);
        let subscriber = tracing_subscriber::fmt()
            .json()
            .event_format(WithTrace(format))
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let call = Context::root();
        tracing::info!(route = "orders", "Outside.");
        in_call(call, async { tracing::info!(route = "orders", "Inside.") }).await;
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let parsed: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(parsed.len(), 2, "{text}");
        assert!(parsed[0].get("trace_id").is_none(), "{text}");
        assert_eq!(parsed[1]["trace_id"], call.trace_id.to_string());
        assert_eq!(parsed[1]["span_id"], call.span_id.to_string());
        assert_eq!(parsed[1]["route"], "orders");
        assert_eq!(parsed[1]["message"], "Inside.");
    }
}
