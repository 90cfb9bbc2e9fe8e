//! The crash loop, short: a hopper killed with SIGKILL three times during
//! 5,000 messages with mixed outcomes (ok, retryable, fatal, delayed)
//! loses none, delivers no delayed message early, and every duplicate it
//! hands out comes from the window an offset stays uncommitted. The full
//! run (100,000 messages, 20 kills) is `cargo xtask crash-loop`.

use hopper_tests::crash_loop::{Params, UNCOMMITTED_WINDOW_MS, run};
use hopper_tests::init_tracing;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kill_9s_during_5000_messages_lose_none_and_deliver_none_early() {
    init_tracing();
    let params = Params {
        messages: 5_000,
        kills: 3,
        rate: 500,
        settle: Duration::from_secs(120),
        progress: true,
    };
    let summary = run(&params).await.unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{summary}");
    assert_eq!(summary.kills.len(), 3);
    assert!(summary.lost.is_empty(), "{summary}");
    assert!(summary.early.is_empty(), "{summary}");
    assert!(summary.unexpected.is_empty(), "{summary}");
    for (n, kill) in summary.kills.iter().enumerate() {
        assert_eq!(
            kill.beyond_window,
            0,
            "kill {}: a duplicate whose first copy was older than {UNCOMMITTED_WINDOW_MS} ms\n{summary}",
            n + 1
        );
    }
}
