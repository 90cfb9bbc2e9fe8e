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

/// For the commands that compile handlers while a developer waits (`hopper
/// dev`, `hopper plugin test`): no transparent huge pages for this process.
///
/// mimalloc asks for huge pages on its arenas. A compile allocates and frees
/// hundreds of MiB in a second, and each first touch of a huge page zeroes
/// 2 MiB: with them, a Python handler's Winch compile spent a third of its
/// time in the kernel clearing pages, and took 1.6 s against 1.3 s without
/// (BENCHMARKS.md). `hopper run` keeps them: its compiles are Cranelift's,
/// which they do not slow, and its hot path was measured with them.
///
/// Affects every mapping of the process, those made before included.
/// Returns whether the kernel took the setting.
pub fn without_huge_pages() -> bool {
    // SAFETY: PR_SET_THP_DISABLE takes integers only and changes only this
    // process's paging policy.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_e`, for which the sys
/// crate names no constant. `purge_delay_is_the_option_mimalloc_reads_from_its_env`
/// proves the number against the name mimalloc itself gives it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

#[cfg(test)]
mod tests {
    /// Run in a child process, as it changes the whole process's paging.
    #[test]
    fn without_huge_pages_turns_them_off_for_the_process() {
        const PROBE: &str = "HOPPER_THP_PROBE";
        // SAFETY: PR_GET_THP_DISABLE reads the process's setting.
        let disabled = || unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        if std::env::var_os(PROBE).is_some() {
            // A parent's setting is inherited: start from huge pages on.
            // SAFETY: PR_SET_THP_DISABLE takes integers only.
            let on = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(on, 0, "huge pages cannot be turned on");
            assert_eq!(disabled(), 0, "huge pages do not read back as on");
            assert!(
                super::without_huge_pages(),
                "the kernel refused the setting"
            );
            assert_eq!(disabled(), 1, "huge pages are still on");
            return;
        }
        in_child(
            "allocator::tests::without_huge_pages_turns_them_off_for_the_process",
            &[(PROBE, "1")],
        );
    }

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
        in_child(
            "allocator::tests::purge_delay_is_the_option_mimalloc_reads_from_its_env",
            &[(PROBE, "1"), ("MIMALLOC_PURGE_DELAY", "4321")],
        );
    }

    /// Runs the test `test` alone, in a new process of this test binary with
    /// `env` added, and asserts that it passed: for what a process reads or
    /// sets once, for the whole process.
    fn in_child(test: &str, env: &[(&str, &str)]) {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test])
            .envs(env.iter().copied())
            .status()
            .unwrap();
        assert!(status.success(), "the probe process failed: {status}");
    }
}
