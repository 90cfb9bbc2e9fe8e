//! A dead letter's fingerprint: its route, its reason class and its last
//! error with the variable parts taken out, so that the dead letters of one
//! cause form one group ("order o-1 unknown" and "order o-2 unknown" are
//! one), and those of two causes two (docs/dead-letters.md, fingerprints).
//!
//! The error's **cause** is the error with, in this order:
//! - control characters turned to spaces, runs of white space to one;
//! - URLs kept to their scheme, host and the path segments without a digit
//!   (`http://<n>.<n>.<n>.<n>:<n>/orders/<id>/close`), the query dropped;
//! - quoted values (`"…"`, `'…'`, `` `…` ``) as `"<q>"`, `'<q>'`, `` `<q>` ``;
//! - e-mail addresses as `<email>`, UUIDs as `<uuid>`, RFC 3339 times as
//!   `<time>`, runs of 8 or more hex digits with a letter and a digit (and
//!   `0x…`) as `<hex>`;
//! - every other run of digits as `<n>` (`o-1004` → `o-<n>`);
//! - cut to [`MAX_CAUSE_CHARS`].
//!
//! The **group** is the first 16 hex digits of the SHA-256 of the route,
//! the reason and the cause. It is computed from a record's headers
//! wherever a dead letter is read (CLI, API, console), never read from a
//! header a DLQ writer could forge, so old records group like new ones.

use regex::Regex;
use sha2::{Digest as _, Sha256};
use std::sync::LazyLock;

/// The longest cause, in characters: past it, two errors are one cause.
pub const MAX_CAUSE_CHARS: usize = 160;

/// The variable parts of an error text, as one pattern of named
/// alternatives tried left to right at each position.
static VARIABLE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?P<url>[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]*(?:/[^\s?#]*)?(?:\?[^\s#]*)?(?:#\S*)?)",
        r#"|(?P<dq>"[^"]*")"#,
        r"|(?P<bq>`[^`]*`)",
        r"|(?:^|(?P<pre>[^A-Za-z0-9]))(?P<sq>'[^']*')",
        r"|(?P<email>[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)",
        r"|(?P<uuid>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)",
        r"|(?P<time>\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)",
        r"|(?P<hex>\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{8,}\b)",
        r"|(?P<n>\d+(?:\.\d+)?)",
    ))
    .expect("the fingerprint pattern compiles")
});

/// A URL's host, port and path segments, each with its digits taken out.
static DIGITS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\d+").expect("digits"));

/// `error` with its variable parts taken out (module docs).
pub fn cause(error: &str) -> String {
    // Control characters and white space first: a newline or a tab in a
    // guest's text is one space, as a run of spaces is. Most errors are
    // printable ASCII with single spaces, and are taken as they are.
    let simple = error.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !error.contains("  ")
        && !error.starts_with(' ')
        && !error.ends_with(' ');
    let plain = if simple {
        std::borrow::Cow::Borrowed(error)
    } else {
        let plain: String = error
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        std::borrow::Cow::Owned(plain.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    let mut out = String::with_capacity(plain.len().min(MAX_CAUSE_CHARS * 4));
    let mut last = 0;
    // Past MAX_CAUSE_CHARS * 4 bytes, the cut below is decided.
    for m in VARIABLE.find_iter(&plain) {
        if out.len() >= MAX_CAUSE_CHARS * 4 {
            break;
        }
        out.push_str(&plain[last..m.start()]);
        last = m.end();
        replace(&mut out, m.as_str(), m.start() == 0);
    }
    if out.len() < MAX_CAUSE_CHARS * 4 {
        out.push_str(&plain[last..]);
    }
    if out.len() > MAX_CAUSE_CHARS
        && let Some((cut, _)) = out.char_indices().nth(MAX_CAUSE_CHARS)
    {
        out.truncate(cut);
    }
    out
}

/// Pushes what stands for `m`, one match of [`VARIABLE`] (`first`: at the
/// start of the text), to `out`.
///
/// Which alternative matched is told from the match's own text, not from
/// capture groups, which cost ten times the search: each alternative has
/// a shape no alternative tried before it at that position can have
/// (`tests::the_shape_of_a_match_names_its_alternative` checks this
/// against the named groups on generated text).
fn replace(out: &mut String, m: &str, first: bool) {
    let bytes = m.as_bytes();
    let Some(&lead) = bytes.first() else {
        return;
    };
    if !lead.is_ascii_alphanumeric() {
        // A quote (`"…"`, `` `…` ``), or a quote in single quotes after
        // the character before it; or an e-mail from `.`, `%`, `+`, `-`,
        // `_` (no quote can follow those in one).
        let closes = |q: u8| lead == q && bytes.len() >= 2 && bytes[bytes.len() - 1] == q;
        if closes(b'"') {
            out.push_str("\"<q>\"");
        } else if closes(b'`') {
            out.push_str("`<q>`");
        } else if lead == b'\'' && first {
            out.push_str("'<q>'");
        } else if let mut chars = m.chars()
            && let Some(pre) = chars.next()
            && chars.next() == Some('\'')
        {
            out.push(pre);
            out.push_str("'<q>'");
        } else {
            out.push_str("<email>");
        }
        return;
    }
    if lead.is_ascii_alphabetic() && m.contains("://") {
        out.push_str(&url_cause(m));
    } else if m.contains('@') {
        out.push_str("<email>");
    } else if bytes.get(4) == Some(&b'-') && lead.is_ascii_digit() {
        out.push_str("<time>");
    } else if m.contains('-') {
        out.push_str("<uuid>");
    } else if !bytes.iter().any(u8::is_ascii_digit) {
        // Hex letters alone ("defaced") are a word.
        out.push_str(m);
    } else if bytes.iter().any(u8::is_ascii_alphabetic) {
        out.push_str("<hex>");
    } else {
        out.push_str("<n>");
    }
}

/// A URL as a cause: scheme and host kept (digits as `<n>`), each path
/// segment with a digit as `<id>`, the query and fragment dropped.
fn url_cause(url: &str) -> String {
    // Punctuation that ends a sentence, not the URL: "…/close: 404".
    let bare = url.trim_end_matches([':', ',', ';', '.', ')', ']', '!']);
    let after = &url[bare.len()..];
    let (scheme, rest) = bare.split_once("://").unwrap_or(("", bare));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let mut parts = rest.split('/');
    let host = DIGITS.replace_all(parts.next().unwrap_or_default(), "<n>");
    let mut out = format!("{scheme}://{host}");
    for segment in parts {
        out.push('/');
        if segment.bytes().any(|b| b.is_ascii_digit()) {
            out.push_str("<id>");
        } else {
            out.push_str(segment);
        }
    }
    out.push_str(after);
    out
}

/// The group of a dead letter: 16 hex digits of the SHA-256 of its route,
/// reason and [`cause`].
pub fn group(route: &str, reason: &str, cause: &str) -> String {
    let mut hash = Sha256::new();
    for part in [route, reason, cause] {
        // Lengths first, so no two splits of one text hash alike.
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(&hash.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`cause`] as it reads with the pattern's named groups: what
    /// [`replace`] must agree with.
    fn by_groups(error: &str) -> String {
        let plain: String = error
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let plain = plain.split_whitespace().collect::<Vec<_>>().join(" ");
        let replaced = VARIABLE.replace_all(&plain, |c: &regex::Captures<'_>| {
            if let Some(url) = c.name("url") {
                return url_cause(url.as_str());
            }
            if c.name("dq").is_some() {
                return "\"<q>\"".to_string();
            }
            if c.name("bq").is_some() {
                return "`<q>`".to_string();
            }
            if c.name("sq").is_some() {
                let pre = c.name("pre").map_or("", |p| p.as_str());
                return format!("{pre}'<q>'");
            }
            let hex = c.name("hex").map(|h| h.as_str());
            match (c.name("email"), c.name("uuid"), c.name("time"), hex) {
                (Some(_), ..) => "<email>".into(),
                (_, Some(_), ..) => "<uuid>".into(),
                (_, _, Some(_), _) => "<time>".into(),
                (.., Some(h)) if !h.bytes().any(|b| b.is_ascii_digit()) => h.into(),
                (.., Some(h)) if !h.bytes().all(|b| b.is_ascii_digit()) => "<hex>".into(),
                _ => "<n>".into(),
            }
        });
        replaced.chars().take(MAX_CAUSE_CHARS).collect()
    }

    #[test]
    fn the_shape_of_a_match_names_its_alternative() {
        // Pieces of every alternative, and characters that start, end or
        // break one, joined at random.
        let pieces = [
            "2024-01-02T03:04:05Z",
            "2024-01-02 03:04",
            "123e4567-e89b-12d3-a456-426614174000",
            "abcdefab-abcd-abcd-abcd-abcdefabcdef",
            "http://h1:80/a/1?x=2#f",
            "s3://b/k9.",
            "a@b.co",
            "-x@y.io",
            "0xFF",
            "deadbeef",
            "dead1234beef",
            "12345678",
            "1.5",
            "o-12",
            "'q'",
            "\"q\"",
            "`q`",
            "'",
            "\"",
            "`",
            "@",
            ".",
            "-",
            ":",
            "/",
            " ",
            "T",
            "Z",
            "+",
            "%",
            "_",
            "x",
            "é",
            "9",
            "a",
            "f",
            "g",
            "(",
            "é'q'",
        ];
        let mut rng = fastrand::Rng::with_seed(61);
        for _ in 0..20_000 {
            let n = rng.usize(1..8);
            let text: String = (0..n).map(|_| pieces[rng.usize(..pieces.len())]).collect();
            assert_eq!(cause(&text), by_groups(&text), "{text:?}");
        }
    }

    /// Texts of one cause, differing only in their variable parts.
    fn same(texts: &[&str]) {
        let causes: Vec<String> = texts.iter().map(|t| cause(t)).collect();
        for c in &causes[1..] {
            assert_eq!(c, &causes[0], "{texts:?}");
        }
    }

    /// Texts of different causes.
    fn different(texts: &[&str]) {
        for (i, a) in texts.iter().enumerate() {
            for b in &texts[i + 1..] {
                assert_ne!(cause(a), cause(b), "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn the_order_timeout_handlers_reasons_group_by_cause() {
        // Rust, Python, JavaScript and C word these alike (plugins/order-timeout*).
        same(&[
            "order o-1009 is unknown to the order service",
            "order o-42 is unknown to the order service",
        ]);
        assert_eq!(
            cause("order o-1009 is unknown to the order service"),
            "order o-<n> is unknown to the order service"
        );
        same(&[
            "order o-1004 has unknown status `refunded`",
            "order o-7 has unknown status `cancelled`",
        ]);
        same(&[
            "order service answered 503 for o-1005",
            "order service answered 502 for o-1",
        ]);
        different(&[
            "order o-1009 is unknown to the order service",
            "order o-1004 has unknown status `refunded`",
            "order service answered 503 for o-1005",
            "payload is not an order: expected ident at line 1 column 2",
        ]);
    }

    #[test]
    fn json_parse_errors_group_whatever_the_position() {
        // serde_json, Python's json and JavaScript's JSON.parse.
        same(&[
            "payload is not an order: expected ident at line 1 column 2",
            "payload is not an order: expected ident at line 3 column 17",
        ]);
        same(&[
            "payload is not an order: Expecting value: line 1 column 1 (char 0)",
            "payload is not an order: Expecting value: line 2 column 5 (char 40)",
        ]);
        same(&[
            "payload is not an order: Unexpected token 'h', \"this is not json\" is not valid JSON",
            "payload is not an order: Unexpected token 'x', \"xyz\" is not valid JSON",
        ]);
        different(&[
            "payload is not an order: expected ident at line 1 column 2",
            "payload is not an order: missing field `order_id` at line 1 column 9",
        ]);
    }

    #[test]
    fn the_hosts_own_reasons_and_a_panic_group_by_cause() {
        same(&[
            "handler timed out after 2s (the route's timeout)",
            "handler timed out after 30s (the route's timeout)",
        ]);
        same(&[
            "handler trapped: wasm trap: wasm `unreachable` instruction executed\n  0: 0x1f3a - <unknown>!rust_panic\n  1: 0x2b4c - <unknown>!core::panicking::panic_fmt",
            "handler trapped: wasm trap: wasm `unreachable` instruction executed\n  0: 0x1f44 - <unknown>!rust_panic\n  1: 0x2b90 - <unknown>!core::panicking::panic_fmt",
        ]);
        same(&[
            "panicked at src/lib.rs:42:9: called `Option::unwrap()` on a `None` value",
            "panicked at src/lib.rs:57:13: called `Option::unwrap()` on a `None` value",
        ]);
        different(&[
            "handler timed out after 2s (the route's timeout)",
            "handler ran out of fuel",
            "memory limit of 64 MiB reached",
        ]);
    }

    #[test]
    fn http_errors_keep_the_host_and_the_fixed_path() {
        same(&[
            "POST http://127.0.0.1:37649/orders/o-1009/close: 404 Not Found",
            "POST http://127.0.0.1:41111/orders/o-77/close?try=2: 404 Not Found",
        ]);
        assert_eq!(
            cause("POST https://pay.example.com/v1/callbacks/5f3a9c?sig=abc: 500"),
            "POST https://pay.example.com/<id>/callbacks/<id>: <n>"
        );
        different(&[
            "POST https://pay.example.com/callbacks/1: 500",
            "POST https://mail.example.com/callbacks/1: 500",
            "GET https://pay.example.com/refunds/1: 500",
        ]);
    }

    #[test]
    fn ids_times_emails_and_hex_are_taken_out() {
        same(&[
            "user alice@example.com not found (request 3f2b1c4e-9a8b-4c7d-8e6f-0a1b2c3d4e5f at 2026-12-06T23:30:25.390Z)",
            "user bob.smith@mail.example.org not found (request 00000000-1111-2222-3333-444444444444 at 2027-01-01 00:00:00+01:00)",
        ]);
        assert_eq!(
            cause(
                "user alice@example.com not found (request 3f2b1c4e-9a8b-4c7d-8e6f-0a1b2c3d4e5f at 2026-12-06T23:30:25.390Z)"
            ),
            "user <email> not found (request <uuid> at <time>)"
        );
        same(&[
            "version 861066833856df11 refused",
            "version deadbeef12345678 refused",
        ]);
        // Hex letters alone are a word, not an id.
        assert_eq!(cause("a defaced cafebabe"), "a defaced cafebabe");
        // An apostrophe inside a word opens no quote.
        assert_eq!(
            cause("can't close order o-1: it's 'paid'"),
            "can't close order o-<n>: it's '<q>'"
        );
    }

    #[test]
    fn hostile_text_is_bounded_and_cleaned() {
        let huge = "x".repeat(1024 * 1024);
        assert_eq!(cause(&huge).chars().count(), MAX_CAUSE_CHARS);
        same(&["bad\u{0}\u{1b}[31mthing\r\n\tnow", "bad  [31mthing now"]);
        assert!(!cause("a\u{7}b\u{1b}c").chars().any(char::is_control));
        // Multi-byte text is cut on a character, not a byte.
        let wide = "é".repeat(1000);
        assert_eq!(cause(&wide).chars().count(), MAX_CAUSE_CHARS);
        assert_eq!(cause(""), "");
        // Plain ASCII is taken as it is; anything else goes through the
        // clean-up first, and both read the same.
        same(&[
            " order 1\u{a0}unknown ",
            "order 2 unknown",
            "order\t3\n unknown",
        ]);
        // A long text is replaced only as far as the cut needs, and cut
        // where the whole replacement would be.
        let numbers = (0..2000).map(|n| n.to_string()).collect::<Vec<_>>();
        let expected = "<n> ".repeat(MAX_CAUSE_CHARS);
        assert_eq!(cause(&numbers.join(" ")), expected[..MAX_CAUSE_CHARS]);
        let quoted = format!("{}'tail'", "é ".repeat(300));
        assert_eq!(cause(&quoted).chars().count(), MAX_CAUSE_CHARS);
        assert_eq!(cause("at 'x' and \"y\""), "at '<q>' and \"<q>\"");
    }

    #[test]
    fn a_group_is_its_route_reason_and_cause() {
        let c = cause("order o-1 is unknown to the order service");
        let g = group("orders", "FATAL", &c);
        assert_eq!(g.len(), 16);
        assert_eq!(
            g,
            group(
                "orders",
                "FATAL",
                &cause("order o-2 is unknown to the order service")
            )
        );
        assert_ne!(g, group("payments", "FATAL", &c));
        assert_ne!(g, group("orders", "RETRIES_EXHAUSTED", &c));
        // The parts are delimited: moving text between them changes it.
        assert_ne!(group("ab", "c", ""), group("a", "bc", ""));
    }
}
