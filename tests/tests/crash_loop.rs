//! The crash loop, short: a hopper killed with SIGKILL three times during
//! 5,000 messages with mixed outcomes (ok, retryable, fatal, delayed)
//! loses none, delivers no delayed message early, and every duplicate it
//! hands out was first produced shortly before a kill, in the window an
//! offset stays uncommitted: no done prefix of the input topic waited
//! longer than that for its commit. The full
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
        rate: 250,
        settle: Duration::from_secs(120),
        progress: true,
    };
    let summary = run(&params).await.unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{summary}");
    assert_eq!(summary.kills.len(), 3);
    assert!(summary.lost.is_empty(), "{summary}");
    assert!(summary.early.is_empty(), "{summary}");
    assert!(summary.unexpected.is_empty(), "{summary}");
    // Every duplicate's first copy was made shortly before its kill: the
    // commit never lagged by more than a few store and commit rounds.
    for (n, kill) in summary.kills.iter().enumerate() {
        assert!(
            kill.oldest_ms <= 2 * UNCOMMITTED_WINDOW_MS,
            "kill {}: a duplicate whose first copy was made {} ms before it\n{summary}",
            n + 1,
            kill.oldest_ms
        );
        // And no done prefix waited uncommitted longer than that bound
        // (the figure, ≤ 200 ms, is `cargo xtask crash-loop`'s to measure).
        assert!(
            kill.commit_lag_ms <= UNCOMMITTED_WINDOW_MS,
            "kill {}: a done prefix waited {} ms uncommitted\n{summary}",
            n + 1,
            kill.commit_lag_ms
        );
    }
    // (Often no first hop off the input topic is made again at all: the
    // lag's judgement, and that it sees a late commit, is unit-tested in
    // hopper_tests::crash_loop.)
}
