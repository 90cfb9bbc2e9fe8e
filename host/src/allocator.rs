//! Which memory allocator hopper's binaries install
//! (`#[global_allocator]`), and how they tune it; the library itself only
//! names them.

/// The memory allocator of hopper's binaries and benchmarks. A hop makes
/// many small allocations on several threads (the calls, the
/// producer's callback thread); glibc's malloc spends a third of the hop
/// path growing and trimming its per-thread heaps (BENCHMARKS.md).
///
/// With mimalloc's `override` feature it also serves the C code's `malloc`
/// and `free`: librdkafka allocates each header of a record it produces, and
/// frees it on its own thread once the record is acknowledged, which cost
/// glibc's malloc a fifth of the dead-letter path.
pub use mimalloc::MiMalloc as Allocator;

/// Tunes [`Allocator`]; binaries call it first thing. Freed pages are kept
/// for a second before they go back to the OS, instead of 10 ms: librdkafka
/// frees and refills its fetch buffers many times a second, and returning
/// them at once made a fifth of the no-op path page faults (BENCHMARKS.md).
pub fn tune_allocator() {
    // SAFETY: sets a process-wide option, which mimalloc allows from any
    // thread at any time; `MI_OPTION_PURGE_DELAY` is checked to be the
    // purge delay by the test below.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_e`, for which the sys
/// crate names no constant. `purge_delay_is_the_option_mimalloc_reads_from_its_env`
/// proves the number against the name mimalloc itself gives it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

#[cfg(test)]
mod tests {
    /// mimalloc reads each option from `MIMALLOC_<NAME>` in the environment
    /// when it first reads the option. So a process started with
    /// `MIMALLOC_PURGE_DELAY` set reads that value back from option 15 only
    /// if option 15 is the purge delay.
    #[test]
    fn purge_delay_is_the_option_mimalloc_reads_from_its_env() {
        const PROBE: &str = "HOPPER_PURGE_DELAY_PROBE";
        if std::env::var_os(PROBE).is_some() {
            // SAFETY: reads a process-wide option.
            let value = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
            assert_eq!(value, 4321, "option 15 is not MIMALLOC_PURGE_DELAY");
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "allocator::tests::purge_delay_is_the_option_mimalloc_reads_from_its_env",
            ])
            .env(PROBE, "1")
            .env("MIMALLOC_PURGE_DELAY", "4321")
            .status()
            .unwrap();
        assert!(status.success(), "the probe process failed: {status}");
    }
}
