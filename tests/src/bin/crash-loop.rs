//! `cargo xtask crash-loop [--messages N] [--kills K] [--rate R] [--settle SECS]`:
//! kill -9 a running hopper K times during a run of N messages with mixed
//! outcomes, restarting it each time, then count every message's fate
//! (hopper_tests::crash_loop). Exits 1 when a message was lost, delivered
//! early, or ended where it should not.

use hopper_tests::crash_loop::{Params, run};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let params = match Params::from_args(std::env::args().skip(1)) {
        Ok(params) => params,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(&params).await {
        Ok(summary) => {
            println!("{summary}");
            if summary.passed() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
