//! Log lines that cannot be forged, and JSON lines that carry the trace.
//!
//! Much of what hopper logs comes from outside: a handler's log lines and
//! output, the URLs it asks for, its verdict reasons, the ids and topics it
//! emits to, and librdkafka's lines about brokers. A line feed or a
//! terminal escape in any of them would let it print lines that look like
//! hopper's own. So every field value is written with its control
//! characters escaped ([`escape_controls`]): in the text format by
//! [`EscapedFields`], in JSON by [`WithTrace`], after serde's escaping.
//!
//! A JSON line logged while a handler call runs (the guest's own logs, its
//! HTTP requests, its emits) gets the call's `trace_id` and `span_id`
//! (docs/operations.md, logs).

use std::borrow::Cow;
use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether `c` may move a terminal's cursor, start a new line, or reorder
/// text: the C0 and C1 controls and DEL, the Unicode line and paragraph
/// separators, and the bidirectional overrides and isolates.
fn is_escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character that [`is_escaped`] names written as Rust
/// writes it in a string (`\n`, `\u{1b}`): one line, shown as it is.
/// Borrows when there is none, the common case.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A JSON line with the characters [`is_escaped`] names that serde leaves
/// raw (DEL, the C1 controls, the separators and bidi controls) written as
/// `\uXXXX`: the same JSON value, on one line, without them. The line's
/// own end is kept.
fn escape_json(line: String) -> String {
    let body = line.strip_suffix('\n').unwrap_or(&line);
    if !body.chars().any(is_escaped) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in body.chars() {
        if is_escaped(c) {
            // Outside a string a JSON line has only ASCII punctuation, so
            // such a character is inside one, where `\u` means it.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    if line.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// The text format's fields, each value with its control characters
/// escaped ([`escape_controls`]): the message as written, every other field
/// as `name=value`, strings quoted.
#[derive(Debug, Default, Clone, Copy)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(
        &self,
        writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = Escaping {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Escaping<'a> {
    writer: Writer<'a>,
    first: bool,
    result: std::fmt::Result,
}

impl Escaping<'_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        let value = escape_controls(value);
        self.result = if field.name() == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            write!(self.writer, "{separator}{}={value}", field.name())
        };
    }
}

impl Visit for Escaping<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value);
        } else {
            self.write(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// Wraps a JSON event format: within a handler call, the object gets
/// `trace_id` and `span_id` first; elsewhere the line is the inner
/// format's. Either way, with no raw control character ([`escape_json`]).
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
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let line = escape_json(line);
        let Some(call) = super::current_call() else {
            return writer.write_str(&line);
        };
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
    use crate::trace::in_call;
    use crate::traceparent::Context;
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

    /// A guest's text that would print a line of hopper's own, erase the
    /// line before it, and reorder what follows.
    const FORGED: &str = "done\n2026-12-06T00:00:00Z  INFO hopper: Route orders stopped.\x1b[2K\r\u{9b}31m\u{7f}\u{2028}\u{202e}";

    fn raw_controls(text: &str) -> Vec<char> {
        let body = text.strip_suffix('\n').unwrap_or(text);
        body.chars().filter(|&c| is_escaped(c)).collect()
    }

    /// What the subscriber `make` builds around a writer writes for one
    /// event whose message and fields are [`FORGED`]; checked to be one
    /// line without a raw control character.
    fn log_forged<S>(make: impl FnOnce(Lines) -> S) -> String
    where
        S: Subscriber + Send + Sync + 'static,
    {
        log_text(make, FORGED)
    }

    /// [`log_forged`] with `guest` as the message and fields.
    fn log_text<S>(make: impl FnOnce(Lines) -> S, guest: &str) -> String
    where
        S: Subscriber + Send + Sync + 'static,
    {
        let lines = Lines::default();
        let subscriber = make(lines.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(route = "orders", url = %guest, reason = guest, "{guest}");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert_eq!(raw_controls(&text), Vec::<char>::new(), "{text:?}");
        text
    }

    fn text_subscriber(writer: Lines) -> impl Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .fmt_fields(EscapedFields)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }

    fn json_subscriber(writer: Lines) -> impl Subscriber + Send + Sync + 'static {
        let format = tracing_subscriber::fmt::format().json().flatten_event(true);
        tracing_subscriber::fmt()
            .json()
            .event_format(WithTrace(format))
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Guest text biased to what a forger would use: line ends, escapes,
    /// C1 controls, separators and bidi controls among printable text.
    fn guest_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pieces = prop_oneof![
            4 => "[ -~]{0,8}",
            2 => prop::sample::select(vec!["\n", "\r", "\x1b[2K", "\u{9b}", "\u{85}", "\u{7f}", "\u{2028}", "\u{2029}", "\u{202e}", "\u{2066}", "\t", "\0", "\"", "\\\\"]).prop_map(str::to_string),
            1 => any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(pieces, 0..24).prop_map(|p| p.concat())
    }

    /// Fuzz targets of the log path.
    mod fuzz {
        use super::*;

        proptest::proptest! {
            #![proptest_config(proptest::test_runner::Config::with_cases(
                std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512)
            ))]

            /// Fuzz target: any guest text is one line with no raw control, in
            /// both formats, and the JSON line keeps the text as its value.
            #[test]
            fn any_guest_text_logs_as_one_line_without_raw_controls(guest in guest_text()) {
                log_text(text_subscriber, &guest);
                let line = log_text(json_subscriber, &guest);
                let parsed: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
                proptest::prop_assert_eq!(parsed["reason"].as_str(), Some(guest.as_str()));
                proptest::prop_assert_eq!(parsed["message"].as_str(), Some(guest.as_str()));
                let escaped = escape_controls(&guest);
                proptest::prop_assert!(!escaped.chars().any(is_escaped), "{:?}", escaped);
            }
        }
    }

    #[test]
    fn no_field_of_a_text_line_can_start_a_line_or_move_the_cursor() {
        let text = log_forged(text_subscriber);
        assert!(text.contains("done\\n2026"), "{text}");
        assert!(text.contains("\\u{1b}[2K\\r\\u{9b}31m"), "{text}");
        assert!(text.contains(" route=\"orders\""), "{text}");
        assert!(text.contains(" url=done\\n"), "{text}");
    }

    #[test]
    fn no_field_of_a_json_line_holds_a_raw_control_and_each_keeps_its_value() {
        let text = log_forged(json_subscriber);
        let parsed: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        for field in ["message", "url", "reason"] {
            assert_eq!(parsed[field], FORGED, "{field} in {text}");
        }
    }

    #[test]
    fn text_without_controls_is_borrowed() {
        assert!(matches!(escape_controls("plain ünïcode"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\tb\u{85}c"), "a\\tb\\u{85}c");
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
