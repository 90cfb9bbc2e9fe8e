//! The log lines hopper writes in a test binary, from every thread, kept
//! so a test can wait for a fact that is only logged.
//!
//! One global subscriber, at `warn` and above, installed by the first call
//! of [`capture`]; a binary that uses it calls [`capture`] instead of
//! [`crate::init_tracing`] in every test.

use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

static TEXT: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Appends to [`TEXT`].
struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        TEXT.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts keeping every log line at `warn` and above, once per binary.
pub fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Sink)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
    });
}

/// Lines logged so far that contain every one of `needles`.
pub fn lines_with(needles: &[&str]) -> Vec<String> {
    String::from_utf8_lossy(&TEXT.lock().unwrap())
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_string)
        .collect()
}

/// Waits until `count` lines containing every one of `needles` have been
/// logged, within [`crate::PATIENCE`]; returns them.
pub async fn wait_for_lines(needles: &[&str], count: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    loop {
        let lines = lines_with(needles);
        if lines.len() >= count {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} log lines with {needles:?} within {:?}",
            lines.len(),
            crate::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
