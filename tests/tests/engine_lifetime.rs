//! A stopped hopper frees its WebAssembly engine, and with it the pooling
//! allocator's address-space reservation and the epoch thread.
//!
//! Regression: health held a closure over the handler slots, the slots held
//! the handlers and their engine, the handlers' grants held the telemetry,
//! and the telemetry held health. That cycle kept every stopped hopper's
//! engine alive (8 TiB of reserved address space each, and an epoch thread),
//! so a process that started ~18 hoppers failed with `mmap failed to
//! reserve`.

use hopper::events::{self, Event};
use hopper_tests::*;

/// Hoppers started and stopped one after another in this process, unless
/// `HOPPER_TEST_HOPPERS` asks for another count (BENCHMARKS.md ran 120).
fn hoppers() -> usize {
    std::env::var("HOPPER_TEST_HOPPERS")
        .ok()
        .map(|n| n.parse().expect("HOPPER_TEST_HOPPERS is a count"))
        .unwrap_or(50)
        .max(1)
}

/// The allocator of the `hopper` binary, so RSS is what hopper's own
/// process would hold.
#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

/// Returns what the allocator holds freed to the OS at once, rather than
/// after its purge delay: then RSS is what is still in use.
fn release_freed_memory() {
    // SAFETY: mimalloc allows a collection from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// A field of /proc/self/status, in KiB (`VmRSS`, `VmSize`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The threads of this process whose name is `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stopped_hopper_frees_its_engine() {
    init_tracing();
    hopper::tune_allocator();
    let (mut held, mut rss, mut reserved) = (Vec::new(), Vec::new(), Vec::new());
    let hoppers = hoppers();
    for round in 0..hoppers {
        // The admin server and the metrics make health (read by both) and
        // the lag sampler part of each hopper, as in production.
        let route = ConfigBuilder::new()
            .route(RouteTable::new(&plugin("noop")))
            .admin(AdminTable::loopback().metrics())
            .test_route();
        let hopper = route.start().await;
        let engine = hopper.engine();
        let mut events = hopper.events();
        // One call, so a warm instance (a store holding the engine) sits in
        // the handler's pool when the hopper stops.
        let id = format!("m{round}");
        // A producer per round: one kept for every round would keep the
        // state of each round's topic, which is not hopper's.
        let producer = producer();
        produce(&producer, &route.input, None, "x", &[("hopper-id", &id)]).await;
        drop(producer);
        let verdict = wait_for_event(&mut events, "the round's call", |e| match e {
            Event::Handled(events::Handled {
                id: got, verdict, ..
            }) if *got == id => Some(*verdict),
            _ => None,
        })
        .await;
        assert_eq!(verdict, "ok", "round {round}");
        assert_eq!(
            hopper.status()[0].version,
            hopper.handler_version(&route.name).unwrap(),
            "health reads the serving version"
        );
        // The watch sees an engine that is there.
        assert!(
            engine.alive(),
            "round {round}: the engine is alive while hopper runs"
        );
        assert_eq!(threads_named("hopper-epoch"), 1, "round {round}");

        assert_eq!(
            hopper.stop().await,
            hopper::Stopped::Cleanly,
            "round {round}"
        );
        assert!(
            !engine.alive(),
            "round {round}: the engine outlived hopper::stop"
        );
        assert_eq!(
            threads_named("hopper-epoch"),
            0,
            "round {round}: epoch thread left"
        );
        held.push(status_kib("VmRSS:"));
        release_freed_memory();
        rss.push(status_kib("VmRSS:"));
        reserved.push(status_kib("VmSize:"));
    }
    let gib = |kib: u64| kib as f64 / (1 << 20) as f64;
    let samples = |kib: &[u64]| {
        let at: Vec<String> = std::iter::once(1)
            .chain((10..=hoppers).step_by(10))
            .map(|n| format!("{n}: {:.1} MiB", kib[n - 1] as f64 / 1024.0))
            .collect();
        at.join(", ")
    };
    eprintln!("RSS after hopper {}", samples(&rss));
    eprintln!(
        "RSS after hopper, before freed memory is returned {}",
        samples(&held)
    );
    eprintln!(
        "{hoppers} hoppers started and stopped: RSS after the first {:.1} MiB, after the last {:.1} MiB; address space after the first {:.1} GiB, after the last {:.1} GiB",
        rss[0] as f64 / 1024.0,
        rss[hoppers - 1] as f64 / 1024.0,
        gib(reserved[0]),
        gib(reserved[hoppers - 1]),
    );
    // Each engine reserves over a TiB of address space; had one survived,
    // the reservation would show it. 64 GiB of slack covers allocator
    // arenas and thread stacks.
    assert!(
        reserved[hoppers - 1] < reserved[0] + (64 << 20),
        "address space grew from {:.1} GiB to {:.1} GiB",
        gib(reserved[0]),
        gib(reserved[hoppers - 1])
    );
}
