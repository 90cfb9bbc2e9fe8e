//! `[route.secrets]`: values a handler may read, from the environment or a
//! file, read once at startup and kept out of every log line and header.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// A secret's value. Its `Debug` never shows the value, so a config
/// printed for debugging leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The secrets a route grants, by name, read once at startup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets(BTreeMap<String, Secret>);

impl Secrets {
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn insert(&mut self, name: &str, value: String) {
        self.0.insert(name.to_string(), Secret(value.into()));
    }

    /// The length of the longest secret value, in bytes.
    pub fn longest(&self) -> usize {
        self.0.values().map(|s| s.expose().len()).max().unwrap_or(0)
    }

    /// `text` with every secret value in it replaced by `[secret NAME]`,
    /// whether it is written as is or percent-encoded, wholly or in part
    /// (`%2B` for base64's `+`, in either case of hex): a handler may put a
    /// secret into a URL. A secret spanning lines is found too, so redact a
    /// whole text before splitting it into lines. Borrows when there is
    /// nothing to replace, which is the common case.
    pub fn redact<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let secrets = self.longest_first();
        if secrets.is_empty() {
            return std::borrow::Cow::Borrowed(text);
        }
        // Copies as written first: a `%` just before one would otherwise
        // decode with its first characters and hide it.
        let mut out = std::borrow::Cow::Borrowed(text);
        for (name, secret) in &secrets {
            if out.contains(secret.expose()) {
                out = out
                    .replace(secret.expose(), &format!("[secret {name}]"))
                    .into();
            }
        }
        if !out.contains('%') {
            return out;
        }
        let encoded = match redact_encoded(&out, &secrets) {
            std::borrow::Cow::Owned(encoded) => Some(encoded),
            std::borrow::Cow::Borrowed(_) => None,
        };
        encoded.map_or(out, std::borrow::Cow::Owned)
    }

    /// `text` redacted and cut to at most `max` bytes, marked `…` where it
    /// is cut, without reading more of it than `max` and room for a secret
    /// that starts before the cut: a guest's text may be as long as its
    /// memory, and redaction allocates per byte it reads. What the host
    /// holds of it is therefore bounded by `max` plus three times the
    /// longest secret (percent-encoding triples a secret), whatever its
    /// length.
    pub fn redact_within<'a>(&self, text: &'a str, max: usize) -> std::borrow::Cow<'a, str> {
        let window = max.saturating_add(3 * self.longest());
        let read = if text.len() > window {
            let mut end = window;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        } else {
            text
        };
        let redacted = self.redact(read);
        let redacted = if read.len() < text.len() {
            // The window may end inside a secret, which redaction leaves
            // as it is: its start goes.
            let partial = self.partial_at_end(redacted.as_bytes());
            match redacted {
                std::borrow::Cow::Borrowed(r) => {
                    std::borrow::Cow::Borrowed(&r[..r.len() - partial])
                }
                std::borrow::Cow::Owned(mut r) => {
                    r.truncate(r.len() - partial);
                    std::borrow::Cow::Owned(r)
                }
            }
        } else {
            redacted
        };
        if redacted.len() <= max && read.len() == text.len() {
            return redacted;
        }
        let mut end = max.min(redacted.len()).saturating_sub('…'.len_utf8());
        while !redacted.is_char_boundary(end) {
            end -= 1;
        }
        std::borrow::Cow::Owned(format!("{}…", &redacted[..end]))
    }

    /// Secrets, longest first, so a secret that contains another is
    /// replaced whole. An empty value is left out: it is found between
    /// every two characters, and hides nothing (config load refuses one,
    /// so this is the redactor's own guard).
    fn longest_first(&self) -> Vec<(&String, &Secret)> {
        let mut all: Vec<_> = self
            .0
            .iter()
            .filter(|(_, s)| !s.expose().is_empty())
            .collect();
        all.sort_by_key(|(_, s)| std::cmp::Reverse(s.expose().len()));
        all
    }

    /// How many bytes at the end of `text` are the start of a secret (and
    /// not the whole of one): what a cut through a secret leaves behind,
    /// for the caller to drop.
    pub fn partial_at_end(&self, text: &[u8]) -> usize {
        self.0
            .values()
            .map(|secret| {
                let secret = secret.expose().as_bytes();
                (1..secret.len().min(text.len() + 1))
                    .rev()
                    .find(|&n| text.ends_with(&secret[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

/// Redacts `secrets` in `text` as if every `%XX` in it were decoded: finds
/// each secret in the decoded bytes, and replaces the text it came from.
fn redact_encoded<'a>(text: &'a str, secrets: &[(&String, &Secret)]) -> std::borrow::Cow<'a, str> {
    let bytes = text.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    // Each decoded byte, with the span of `text` it came from.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut spans = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            decoded.push(hi << 4 | lo);
            spans.push((i, i + 3));
            i += 3;
        } else {
            decoded.push(bytes[i]);
            spans.push((i, i + 1));
            i += 1;
        }
    }
    // The start of each replaced span in `text`: its end and the name.
    let mut taken = vec![false; decoded.len()];
    let mut replaced: Vec<(usize, usize, &str)> = Vec::new();
    for (name, secret) in secrets {
        let needle = secret.expose().as_bytes();
        if needle.is_empty() {
            continue;
        }
        let mut at = 0;
        while at + needle.len() <= decoded.len() {
            let end = at + needle.len();
            if decoded[at..end] == *needle && !taken[at..end].iter().any(|t| *t) {
                taken[at..end].iter_mut().for_each(|t| *t = true);
                replaced.push((spans[at].0, spans[end - 1].1, name.as_str()));
                at = end;
            } else {
                at += 1;
            }
        }
    }
    if replaced.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    replaced.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (start, end, name) in replaced {
        // Spans begin at `%` or at the first byte of a character, and end
        // after a whole one, so these are character boundaries; a secret
        // whose bytes were decoded into the middle of one is cut around it.
        let start = floor_boundary(text, start);
        out.push_str(&text[from..start.max(from)]);
        out.push_str(&format!("[secret {name}]"));
        from = ceil_boundary(text, end);
    }
    out.push_str(&text[from.min(text.len())..]);
    std::borrow::Cow::Owned(out)
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(text: &str, mut i: usize) -> usize {
    while i < text.len() && !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Reads a secret from `env:VARIABLE` or `file:PATH`. A problem names the
/// variable or file, never the value.
pub(super) fn read_secret(name: &str, source: &str, base: &Path) -> Result<String, String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("a secret name has only ASCII letters, digits, `-`, `_` and `.`".into());
    }
    read_source(source, base)
}

/// Whether `value` names where a value is read from (`env:` or `file:`)
/// rather than being the value itself.
pub(super) fn is_source(value: &str) -> bool {
    value.starts_with("env:") || value.starts_with("file:")
}

/// Reads a value from `env:VARIABLE` or `file:PATH` (relative to `base`),
/// without its file's last newline. A problem names the variable or file,
/// never the value.
pub(super) fn read_source(source: &str, base: &Path) -> Result<String, String> {
    let value = if let Some(var) = source.strip_prefix("env:") {
        match std::env::var(var) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => {
                return Err(format!("environment variable {var} is not set"));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("environment variable {var} is not UTF-8"));
            }
        }
    } else if let Some(path) = source.strip_prefix("file:") {
        let path = base.join(path);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read file {}: {e}", path.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("file {} is not UTF-8 text", path.display()))?;
        // Files written by editors and `echo` end with a newline that is not
        // part of the secret.
        let trimmed = text.strip_suffix('\n').unwrap_or(&text);
        trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string()
    } else {
        return Err(format!(
            "source `{source}` is neither `env:VARIABLE` nor `file:PATH`"
        ));
    };
    if value.is_empty() {
        return Err(format!("{source} is empty"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(values: &[(&str, &str)]) -> Secrets {
        let mut s = Secrets::default();
        for (name, value) in values {
            s.insert(name, value.to_string());
        }
        s
    }

    /// Fuzz targets of the reason path.
    mod fuzz {
        use super::secrets;
        use proptest::prelude::*;

        /// A guest's reason or log line: printable filler and `%`, with copies
        /// of the secret as written, fully percent-encoded, and cut short.
        fn reason_with(secret: String) -> impl Strategy<Value = String> {
            let encoded: String = secret.bytes().map(|b| format!("%{b:02X}")).collect();
            let pieces = prop_oneof![
                3 => "[a-z %]{0,12}",
                1 => Just(secret.to_string()),
                1 => Just(encoded),
                1 => (1..secret.len()).prop_map({
                    let secret = secret.to_string();
                    move |n| secret[..n].to_string()
                }),
                1 => any::<char>().prop_map(String::from),
            ];
            prop::collection::vec(pieces, 0..16).prop_map(|p| p.concat())
        }

        proptest::proptest! {
            #![proptest_config(proptest::test_runner::Config::with_cases(
                std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1024)
            ))]

            /// Fuzz target for a guest's reason: whatever it holds and wherever
            /// the cut falls, what is kept fits the bound, and no secret, as
            /// written or encoded, is in it.
            #[test]
            fn a_reason_is_bounded_and_holds_no_secret(
                (secret, reason) in "[A-Z0-9]{4,12}".prop_flat_map(|secret| (Just(secret.clone()), reason_with(secret))),
                max in 0usize..96,
            ) {
                let s = secrets(&[("k", &secret)]);
                let kept = s.redact_within(&reason, max);
                proptest::prop_assert!(kept.len() <= max.max('…'.len_utf8()), "{} bytes kept of {max}: {kept:?}", kept.len());
                proptest::prop_assert!(!kept.contains(&secret), "{kept:?}");
                let encoded: String = secret.bytes().map(|b| format!("%{b:02X}")).collect();
                proptest::prop_assert!(!kept.contains(&encoded), "{kept:?}");
                if reason.len() <= max && !reason.contains(&secret) && !reason.contains('%') {
                    proptest::prop_assert_eq!(&*kept, &*reason);
                }
            }
        }
    }

    #[test]
    fn a_text_is_cut_before_it_is_redacted_and_never_leaves_a_secrets_start() {
        let s = secrets(&[("token", "Sup3r-s3cret")]);
        // Short text is borrowed, or redacted whole.
        assert!(matches!(
            s.redact_within("fine", 16),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(s.redact_within("a Sup3r-s3cret", 64), "a [secret token]");
        // A secret that starts before the cut is redacted, even encoded.
        let text = format!("{}Sup3r%2Ds3cret{}", "x".repeat(10), "y".repeat(1 << 20));
        let cut = s.redact_within(&text, 32);
        assert_eq!(cut, "xxxxxxxxxx[secret token]yyyyy…");
        assert!(cut.len() <= 32);
        // The read window (32 + 3 x 12 bytes) ends inside a second copy,
        // after a first one that redaction shortened: its start goes.
        for at in 40..80 {
            let text = format!(
                "Sup3r-s3cret{}Sup3r-s3cret{}",
                "z".repeat(at - 12),
                "w".repeat(100)
            );
            let cut = s.redact_within(&text, 32);
            assert!(cut.len() <= 32, "{at}: {cut}");
            assert!(!cut.contains("Sup"), "{at}: {cut}");
        }
    }

    #[test]
    fn a_secret_spanning_lines_is_redacted_in_the_whole_text() {
        let pem = "-----BEGIN KEY-----\nMIIBOgIBAAJBAK\n-----END KEY-----";
        let s = secrets(&[("key", pem)]);
        let text = format!("before\n{pem}\nafter");
        assert_eq!(s.redact(&text), "before\n[secret key]\nafter");
        // Line by line, no line holds it whole: why whole texts are redacted.
        assert!(text.lines().all(|l| s.redact(l) == l));
    }

    /// Regression: an empty secret (an inline `"ssl.key.password" = ""`)
    /// put a marker between every two characters, and a text with `%` then
    /// panicked the redactor (an index at `end - 1` with `end = 0`), on
    /// librdkafka's polling thread.
    #[test]
    fn an_empty_secret_is_no_needle() {
        let s = secrets(&[("ssl.key.password", ""), ("token", "s3cr3t")]);
        assert_eq!(s.redact("100% of s3cr3t%21"), "100% of [secret token]%21");
        assert_eq!(s.redact("50%25 done"), "50%25 done");
        assert_eq!(s.redact_within("%41% s3cr3t", 100), "%41% [secret token]");
        let only_empty = secrets(&[("ssl.key.password", "")]);
        assert_eq!(only_empty.redact("a % b"), "a % b");
        assert_eq!(only_empty.partial_at_end(b"abc"), 0);
    }

    #[test]
    fn a_percent_encoded_secret_is_redacted() {
        // Regression: base64's `+/=` percent-encoded into a URL passed.
        let s = secrets(&[("token", "ab+c/d=")]);
        for (text, expected) in [
            ("http://h/x/ab%2Bc%2Fd%3D/y", "http://h/x/[secret token]/y"),
            ("http://h/ab%2bc%2fd%3d", "http://h/[secret token]"),
            ("http://h/ab%2Bc/d%3D?", "http://h/[secret token]?"),
            ("%61%62%2B%63%2F%64%3D", "[secret token]"),
            ("ab+c/d= and %ab+c/d=", "[secret token] and %[secret token]"),
            ("ab%2Bc%2F", "ab%2Bc%2F"),
            ("100% sure, ab+c/d=", "100% sure, [secret token]"),
            ("é%C3%A9 ab+c/d=%", "é%C3%A9 [secret token]%"),
        ] {
            assert_eq!(s.redact(text), expected, "{text}");
        }
        let unicode = secrets(&[("u", "é!")]);
        assert_eq!(unicode.redact("x%C3%A9%21y"), "x[secret u]y");
    }

    #[test]
    fn the_longest_secret_wins_and_nothing_else_changes() {
        let s = secrets(&[("short", "abc"), ("long", "xabcx")]);
        assert_eq!(s.redact("xabcx abc"), "[secret long] [secret short]");
        assert_eq!(s.redact("x%61bcx"), "[secret long]");
        assert!(matches!(
            s.redact("nothing %41"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn the_start_of_a_cut_secret_is_found_at_the_end() {
        let s = secrets(&[("a", "secret-value"), ("b", "xy")]);
        assert_eq!(s.partial_at_end(b"output secret-va"), 9);
        assert_eq!(s.partial_at_end(b"output x"), 1);
        assert_eq!(s.partial_at_end(b"output secret-value"), 0, "a whole one");
        assert_eq!(s.partial_at_end(b"output"), 0);
        assert_eq!(s.partial_at_end(b""), 0);
        assert_eq!(s.longest(), 12);
    }
}
