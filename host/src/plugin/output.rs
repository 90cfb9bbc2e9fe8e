//! Guest stdout and stderr, captured into tracing.
//!
//! A guest may write as much as it likes; the host keeps the first
//! [`KEEP_BYTES`] of each call's output, logs it line by line through a
//! per-handler [`LineBudget`], and counts the rest. Writes never fail, since a
//! failed write would make a Rust guest's `println!` panic.
//!
//! Secrets are redacted from the whole output before it is split into lines
//! (a PEM key spans lines) and before it is cut to [`KEEP_BYTES`]: the
//! capture keeps a little more than that, room for a secret (even
//! percent-encoded) that starts before the cut, and drops the start of one
//! that the capture itself cut.

use super::GuestInfo;
use bytes::Bytes;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Output of one call kept for the log; the rest is counted and dropped.
const KEEP_BYTES: usize = 16 << 10;
/// Guest lines (log import and stdio together) a handler may log per second.
const LINES_PER_SECOND: f64 = 100.0;
/// Lines a handler may log in a burst before the rate applies.
const BURST_LINES: f64 = 500.0;

#[derive(Clone)]
pub(super) struct GuestOutput {
    guest: Arc<GuestInfo>,
    stream: &'static str,
    capture: Arc<Mutex<Capture>>,
    /// Set by every write, on stdout and stderr alike (one flag per store),
    /// so a call that wrote nothing, the common case, takes no lock to
    /// find that out ([`Written::take`]).
    written: Written,
}

/// Whether a store's guest wrote to stdout or stderr since the last
/// [`Written::take`].
#[derive(Clone, Default)]
pub(super) struct Written(Arc<AtomicBool>);

impl Written {
    /// True when the guest wrote since the last call; clears the flag.
    pub(super) fn take(&self) -> bool {
        // Relaxed: the writes and this read happen in one call on one
        // store, which the async runtime hands between threads with the
        // ordering its own wake-ups give.
        self.0.swap(false, Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    dropped: u64,
}

impl GuestOutput {
    pub(super) fn new(guest: Arc<GuestInfo>, stream: &'static str, written: Written) -> Self {
        Self {
            guest,
            stream,
            capture: Arc::default(),
            written,
        }
    }

    fn append(&self, bytes: &[u8]) {
        let window = KEEP_BYTES + 3 * self.guest.grants.config.secrets.longest();
        // No .await under this lock.
        let mut capture = self.capture.lock().unwrap();
        let room = window.saturating_sub(capture.kept.len());
        let take = room.min(bytes.len());
        capture.kept.extend_from_slice(&bytes[..take]);
        capture.dropped += (bytes.len() - take) as u64;
        self.written.0.store(true, Ordering::Relaxed);
    }

    /// The first few meaningful lines, for a trap's error text (a Rust
    /// guest's panic message arrives here).
    pub(super) fn summary(&self) -> Option<String> {
        let (text, _) = self.visible(&self.capture.lock().unwrap());
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("note: run with"))
            .take(3)
            .collect();
        (!lines.is_empty()).then(|| crate::headers::shorten(&lines.join(" "), 512))
    }

    /// What of `capture` may be shown: secrets redacted from the whole
    /// text, then cut to [`KEEP_BYTES`]; and the bytes dropped in all.
    fn visible(&self, capture: &Capture) -> (String, u64) {
        let secrets = &self.guest.grants.config.secrets;
        let mut kept: &[u8] = &capture.kept;
        let mut dropped = capture.dropped;
        if dropped > 0 {
            // The capture cut the output; what it cut may be a secret's start.
            let partial = secrets.partial_at_end(kept);
            kept = &kept[..kept.len() - partial];
            dropped += partial as u64;
        }
        let text = String::from_utf8_lossy(kept);
        let text = secrets.redact(&text);
        if text.len() <= KEEP_BYTES {
            return (text.into_owned(), dropped);
        }
        let mut end = KEEP_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        dropped += (text.len() - end) as u64;
        (text[..end].to_string(), dropped)
    }

    /// Logs what the call wrote, within the handler's line budget, at info
    /// level.
    pub(super) fn flush_to_log(&self) {
        let capture = std::mem::take(&mut *self.capture.lock().unwrap());
        if capture.kept.is_empty() && capture.dropped == 0 {
            return;
        }
        let (text, dropped) = self.visible(&capture);
        let g = &self.guest;
        let (route, handler, version, stream) =
            (&g.route, &g.handler, &g.short_version, self.stream);
        // Lines the log leaves out take nothing from the budget.
        if tracing::enabled!(tracing::Level::INFO) {
            for line in text.lines() {
                if g.budget.take() {
                    tracing::info!(route, handler, version, stream, "{line}");
                }
            }
        }
        if dropped > 0 && g.budget.take() {
            tracing::warn!(
                route,
                handler,
                version,
                stream,
                dropped_bytes = dropped,
                "Guest output past {KEEP_BYTES} bytes in one call was dropped."
            );
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A token bucket shared by every call of one handler version, so a chatty
/// guest cannot flood the host's logs. Dropped lines are counted and reported
/// once the budget refills.
pub(super) struct LineBudget {
    // std Mutex: held only for arithmetic, never across an .await.
    state: Mutex<BudgetState>,
}

struct BudgetState {
    tokens: f64,
    refilled_at: Instant,
    dropped: u64,
}

impl LineBudget {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(BudgetState {
                tokens: BURST_LINES,
                refilled_at: Instant::now(),
                dropped: 0,
            }),
        }
    }

    /// True when one more line may be logged.
    pub(super) fn take(&self) -> bool {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let elapsed = now.duration_since(s.refilled_at).as_secs_f64();
        s.tokens = (s.tokens + elapsed * LINES_PER_SECOND).min(BURST_LINES);
        s.refilled_at = now;
        if s.tokens < 1.0 {
            s.dropped += 1;
            return false;
        }
        s.tokens -= 1.0;
        if s.dropped > 0 {
            let dropped = std::mem::take(&mut s.dropped);
            drop(s);
            tracing::warn!(dropped, "Guest log lines were dropped by the rate limit.");
        }
        true
    }
}
