//! What a guest's text costs the host. A handler's reason or log line may
//! be as long as its memory; with a secret configured and `%` in the text,
//! redacting all of it allocated ~18 bytes per byte, outside the handler's
//! memory cap. The host cuts such text first and redacts what it keeps, so
//! a call costs the host the copy of the text that leaves the guest, and
//! little more (docs/operations.md, "Who may do what").
//!
//! This binary counts every byte the process allocates, so it holds one
//! test: another running beside it would count too.

use hopper::plugin::Verdict;
use hopper_tests::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The global allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call goes to `System` as it came; the counters are only
// arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: `p` came from `System` with this layout.
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `p` came from `System` with this layout.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How far the heap rose above where it stood before `call`.
async fn peak_growth<T>(call: impl Future<Output = T>) -> (T, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = call.await;
    (out, PEAK.load(Relaxed).saturating_sub(base))
}

/// Log lines, kept.
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

/// The text the handler returns, and then logs: 8 MiB of `%41`.
const TEXT_BYTES: usize = 8 << 20;

#[tokio::test(flavor = "current_thread")]
async fn megabytes_of_reason_or_log_cost_the_host_their_copy_and_no_more() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // This thread's, and the runtime's only one.
    let _logs = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let secret = rand_name("tok");
    std::fs::write(dir.path().join("token"), &secret).unwrap();
    let route = InProcess::new(RouteTable::new(&plugin("acting")).secret(
        "token",
        format!("file:{}", dir.path().join("token").display()),
    ));
    let script = |verdict: &str| {
        serde_json::json!({
            "steps": [
                {"repeat": format!("{secret}%41"), "times": 1},
                {"repeat": "%41", "times": TEXT_BYTES / 3},
            ],
            "verdict": verdict,
        })
        .to_string()
    };
    // The first call compiles nothing, but fills the instance pool and
    // the host's caches: measure the second.
    route
        .handler
        .call(route.delivery("m-0", &script("fatal")))
        .await;

    let (verdict, growth) =
        peak_growth(route.handler.call(route.delivery("m-1", &script("fatal")))).await;
    println!("a reason of {TEXT_BYTES} bytes: the host's heap grew by {growth}");
    // The text leaves the guest as one copy on the host's heap; redacting
    // all of it took ~17 more.
    assert!(
        growth < 2 * TEXT_BYTES,
        "the host's heap grew by {growth} bytes for a reason of {TEXT_BYTES}"
    );
    let Verdict::Fatal { reason } = verdict else {
        panic!("{verdict:?}");
    };
    assert!(
        reason.len() <= hopper::headers::MAX_ERROR_BYTES,
        "a reason of {} bytes",
        reason.len()
    );
    assert!(reason.starts_with("[secret token]%41 | %41%41"), "{reason}");
    assert!(reason.ends_with('…'), "{reason}");
    assert!(!reason.contains(&secret));

    let (verdict, growth) =
        peak_growth(route.handler.call(route.delivery("m-2", &script("ok")))).await;
    assert_eq!(verdict, Verdict::Ok);
    println!("a log line of {TEXT_BYTES} bytes: the host's heap grew by {growth}");
    assert!(
        growth < 2 * TEXT_BYTES,
        "the host's heap grew by {growth} bytes for a log line of {TEXT_BYTES}"
    );
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged = text
        .lines()
        .find(|l| l.contains("[secret token]%41"))
        .unwrap_or_else(|| panic!("the report is logged:\n{}", &text[..text.len().min(4096)]));
    assert!(
        logged.len() < 4096 + 256,
        "a line of {} bytes",
        logged.len()
    );
    assert!(!text.contains(&secret));
}
