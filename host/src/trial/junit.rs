//! A suite's results as JUnit XML, the report format CI systems read
//! (GitLab, Jenkins, GitHub Actions' test reporters): one `testsuite`, one
//! `testcase` per case, a `failure` holding the diff.

use super::CaseResult;
use std::fmt::Write as _;
use std::time::Duration;

/// The JUnit XML document of a suite named `suite` (the cases file) run on
/// `handler`.
pub fn render(suite: &str, handler: &str, results: &[CaseResult], startup: Duration) -> String {
    let failures = results.iter().filter(|r| !r.passed()).count();
    let total: Duration = results.iter().map(|r| r.took).sum::<Duration>() + startup;
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites tests=\"{}\" failures=\"{failures}\" time=\"{:.6}\">",
        results.len(),
        total.as_secs_f64()
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{:.6}\">",
        escape(suite),
        results.len(),
        total.as_secs_f64()
    );
    let _ = writeln!(
        xml,
        "    <properties><property name=\"handler\" value=\"{}\"/></properties>",
        escape(handler)
    );
    for r in results {
        let _ = write!(
            xml,
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.6}\"",
            escape(suite),
            escape(&r.name),
            r.took.as_secs_f64()
        );
        if r.passed() {
            xml.push_str("/>\n");
            continue;
        }
        let _ = writeln!(
            xml,
            ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
            escape(&r.summary),
            escape(&r.diff.join("\n"))
        );
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

/// Text as XML character data or an attribute value. Characters XML 1.0
/// cannot hold at all (most control characters) become U+FFFD.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_the_diff_and_hostile_text_is_escaped() {
        let results = [
            CaseResult {
                name: "ok <case>".into(),
                diff: Vec::new(),
                summary: "ok".into(),
                took: Duration::from_millis(2),
            },
            CaseResult {
                name: "bad \"one\"\u{1}".into(),
                diff: vec!["verdict:\n  - ok\n  + fatal".into()],
                summary: "fatal: a & b".into(),
                took: Duration::from_millis(3),
            },
        ];
        let xml = render("cases.toml", "h.wasm", &results, Duration::ZERO);
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
        assert!(
            xml.contains("name=\"ok &lt;case&gt;\" time=\"0.002000\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("name=\"bad &quot;one&quot;\u{FFFD}\""),
            "{xml}"
        );
        assert!(
            xml.contains(
                "<failure message=\"fatal: a &amp; b\">verdict:&#10;  - ok&#10;  + fatal</failure>"
            ),
            "{xml}"
        );
    }
}
