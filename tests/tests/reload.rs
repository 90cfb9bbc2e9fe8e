//! Hot reload and the compiled-handler cache, against a real broker and
//! real handler files.

use hopper::events::{self, Event};
use hopper::metrics::series;
use hopper_tests::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// A handler file in its own directory, two versions of it, and a route.
struct Reloadable {
    _dir: tempfile::TempDir,
    path: PathBuf,
    v1: Vec<u8>,
    v2: Vec<u8>,
    route: TestRoute,
}

impl Reloadable {
    fn new() -> Reloadable {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handler.wasm");
        let v1 = std::fs::read(plugin("scripted")).unwrap();
        let v2 = with_custom_section(&v1, "hopper-test", b"v2");
        std::fs::write(&path, &v1).unwrap();
        let route = RouteTable::new(&path).test_route();
        Reloadable {
            _dir: dir,
            path,
            v1,
            v2,
            route,
        }
    }
}

fn handled_version(id: &str) -> impl FnMut(&Event) -> Option<(String, &'static str)> + '_ {
    move |e| match e {
        Event::Handled(events::Handled {
            id: got,
            version,
            verdict,
            ..
        }) if got == id => Some((version.clone(), verdict.as_str())),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_a_steady_stream_handle_every_message_once() {
    init_tracing();
    const SWAPS: usize = 100;
    const MESSAGES: usize = 10_000;
    let r = Reloadable::new();
    let versions = [sha256_hex(&r.v1), sha256_hex(&r.v2)];
    assert_ne!(versions[0], versions[1]);
    let hopper = r.route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    let started = Instant::now();

    let mut handled: Vec<(String, String)> = Vec::new(); // (id, version)
    let mut reloads: Vec<(String, String)> = Vec::new(); // (old, new)
    let mut acks = Vec::new();
    let mut sent = 0;
    let record = |e: &Event, handled: &mut Vec<(String, String)>, reloads: &mut Vec<_>| match e {
        Event::Handled(events::Handled {
            id,
            version,
            verdict,
            ..
        }) => {
            assert_eq!(*verdict, "ok", "{id}");
            handled.push((id.clone(), version.clone()));
        }
        Event::HandlerReloaded(events::HandlerReloaded {
            old_version,
            new_version,
            ..
        }) => reloads.push((old_version.clone(), new_version.clone())),
        Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. }) => {
            panic!("reload failed: {error}")
        }
        _ => {}
    };

    for swap in 0..SWAPS {
        // Swap 0 writes v2, swap 1 writes v1 again, and so on.
        let (bytes, new) = if swap % 2 == 0 {
            (&r.v2, &versions[1])
        } else {
            (&r.v1, &versions[0])
        };
        write_atomically(&r.path, bytes);
        let reloaded_at = handled.len();
        wait_for_event(&mut events, "the new version to be loaded", |e| {
                record(e, &mut handled, &mut reloads);
                matches!(e, Event::HandlerReloaded(events::HandlerReloaded { new_version, .. }) if new_version == new)
                    .then_some(())
            })
        .await;
        // The next slice of the stream, produced while the new version serves.
        for _ in 0..MESSAGES / SWAPS {
            let id = format!("m{sent}");
            let key = format!("k{}", sent % 7);
            let headers = OwnedHeaders::new().insert(Header {
                key: "hopper-id",
                value: Some(&id),
            });
            let record = FutureRecord::to(&r.route.input)
                .key(&key)
                .payload("ok")
                .headers(headers);
            acks.push(
                producer
                    .send_result(record)
                    .map_err(|(e, _)| e)
                    .expect("enqueue"),
            );
            sent += 1;
        }
        // The new version handles messages before the next swap.
        if !handled[reloaded_at..].iter().any(|(_, v)| v == new) {
            wait_for_event(&mut events, "a call of the new version", |e| {
                record(e, &mut handled, &mut reloads);
                matches!(e, Event::Handled(events::Handled { version, .. }) if version == new)
                    .then_some(())
            })
            .await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "too slow: swap {swap}"
        );
    }
    for ack in acks {
        ack.await.expect("delivered").expect("acknowledged");
    }
    while handled.len() < MESSAGES {
        wait_for_event(&mut events, "the next call", |e| {
            record(e, &mut handled, &mut reloads);
            matches!(e, Event::Handled(events::Handled { .. })).then_some(())
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "too slow: {} handled",
            handled.len()
        );
    }

    let mut ids = HashSet::new();
    for (id, version) in &handled {
        assert!(ids.insert(id.as_str()), "{id} was handled twice");
        assert!(
            versions.contains(version),
            "{id} ran unknown version {version}"
        );
    }
    let missing: Vec<String> = (0..MESSAGES)
        .map(|i| format!("m{i}"))
        .filter(|id| !ids.contains(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    assert_eq!(handled.len(), MESSAGES);
    assert_eq!(reloads.len(), SWAPS);
    for (i, (old, new)) in reloads.iter().enumerate() {
        assert_eq!(
            (old, new),
            (&versions[i % 2], &versions[(i + 1) % 2]),
            "swap {i}"
        );
    }
    let status = hopper.status();
    assert_eq!(status[0].version, versions[SWAPS % 2]);
    assert_eq!(status[0].last_reload_error, None);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_leaves_the_old_version_serving_until_a_good_one_arrives() {
    init_tracing();
    let r = Reloadable::new();
    let (v1, v2) = (sha256_hex(&r.v1), sha256_hex(&r.v2));
    let hopper = r.route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    let failed_reloads = series::HandlerReloads {
        route: &r.route.name,
        result: "failed",
    };
    let failures = |hopper: &hopper::Hopper| hopper.telemetry().metrics().get(&failed_reloads);
    // Failure events seen: one per distinct broken content. A write in place
    // that stalls for longer than the debounce between its open (which
    // empties the file) and its write is seen at both stages.
    let mut failed = 0;
    let mut count_failures = |e: &Event| {
        failed += matches!(
            e,
            Event::HandlerReloadFailed(events::HandlerReloadFailed { .. })
        ) as u64
    };

    // A build that dies half-way through writing the file in place.
    std::fs::write(&r.path, &r.v2[..r.v2.len() / 2]).unwrap();
    let error = wait_for_event(
        &mut events,
        "the reload of the truncated file to fail",
        |e| {
            count_failures(e);
            match e {
                Event::HandlerReloadFailed(events::HandlerReloadFailed {
                    version, error, ..
                }) if error.contains("does not compile") => {
                    assert_eq!(*version, v1, "the serving version is reported");
                    Some(error.clone())
                }
                Event::HandlerReloaded(events::HandlerReloaded { .. }) => {
                    panic!("a truncated file was loaded")
                }
                _ => None,
            }
        },
    )
    .await;
    assert!(error.contains(&r.path.display().to_string()), "{error}");
    let status = hopper.status();
    assert_eq!(status[0].version, v1);
    assert_eq!(status[0].last_reload_error.as_deref(), Some(error.as_str()));

    produce(
        &producer,
        &r.route.input,
        None,
        "ok",
        &[("hopper-id", "during")],
    )
    .await;
    let during = wait_for_event(&mut events, "the call of `during`", |e| {
        count_failures(e);
        handled_version("during")(e)
    })
    .await;
    assert_eq!(during, (v1.clone(), "ok"), "v1 keeps serving");

    // The next build writes the whole file.
    std::fs::write(&r.path, &r.v2).unwrap();
    let (old, new) = wait_for_event(&mut events, "the reload of the whole file", |e| {
        count_failures(e);
        match e {
            Event::HandlerReloaded(events::HandlerReloaded {
                old_version,
                new_version,
                ..
            }) => Some((old_version.clone(), new_version.clone())),
            _ => None,
        }
    })
    .await;
    assert_eq!((old, new), (v1.clone(), v2.clone()));
    let status = hopper.status();
    assert_eq!(
        (
            status[0].version.as_str(),
            status[0].last_reload_error.as_deref()
        ),
        (v2.as_str(), None)
    );
    produce(
        &producer,
        &r.route.input,
        None,
        "ok",
        &[("hopper-id", "after")],
    )
    .await;
    let after = wait_for_event(&mut events, "the call of `after`", |e| {
        count_failures(e);
        handled_version("after")(e)
    })
    .await;
    assert_eq!(after, (v2, "ok"));
    assert!(failed >= 1);
    assert_eq!(
        failures(&hopper),
        Some(failed),
        "the counter counts every reported failure"
    );
    hopper.stop().await;
}

/// Swaps `dir/..data` to a new directory holding `bytes` as `handler.wasm`,
/// exactly as the kubelet updates a ConfigMap volume: the new timestamped
/// directory, a `..data_tmp` link to it renamed over `..data`, the old
/// directory removed.
fn kubelet_swap(dir: &Path, generation: u32, bytes: &[u8]) {
    let new = dir.join(format!("..2026_12_05_00_00_0{generation}.000000000"));
    std::fs::create_dir(&new).unwrap();
    std::fs::write(new.join("handler.wasm"), bytes).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(new.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

#[test]
fn a_read_racing_configmap_rollouts_always_gets_a_whole_version() {
    let dir = tempfile::tempdir().unwrap();
    kubelet_swap(dir.path(), 0, b"generation 0");
    let path = dir.path().join("handler.wasm");
    std::os::unix::fs::symlink("..data/handler.wasm", &path).unwrap();
    const SWAPS: u32 = 3_000;
    let swapper = {
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            for generation in 1..=SWAPS {
                kubelet_swap(
                    &dir,
                    generation,
                    format!("generation {generation}").as_bytes(),
                );
            }
        })
    };
    let (mut reads, mut generations) = (0u32, std::collections::BTreeSet::new());
    while !swapper.is_finished() || reads == 0 {
        let bytes =
            hopper::reload::read_handler(&path).unwrap_or_else(|e| panic!("read {reads}: {e}"));
        let text = String::from_utf8(bytes).unwrap();
        let generation: u32 = text.strip_prefix("generation ").unwrap().parse().unwrap();
        generations.insert(generation);
        reads += 1;
    }
    swapper.join().unwrap();
    // The reads overlapped the rollouts: they saw more than one version.
    assert!(
        generations.len() > 1,
        "{reads} reads saw only {generations:?}"
    );
    assert_eq!(
        hopper::reload::read_handler(&path).unwrap(),
        format!("generation {SWAPS}").as_bytes()
    );
}

#[test]
fn a_missing_handler_or_a_dangling_link_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let error = hopper::reload::read_handler(&dir.path().join("handler.wasm")).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    std::os::unix::fs::symlink("..data/handler.wasm", dir.path().join("dangling.wasm")).unwrap();
    let error = hopper::reload::read_handler(&dir.path().join("dangling.wasm")).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_rolled_out_through_a_configmap_is_reloaded_and_links_stay_inside() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let v1 = std::fs::read(plugin("scripted")).unwrap();
    let v2 = with_custom_section(&v1, "hopper-test", b"configmap v2");
    kubelet_swap(dir.path(), 1, &v1);
    let path = dir.path().join("handler.wasm");
    std::os::unix::fs::symlink("..data/handler.wasm", &path).unwrap();
    let route = RouteTable::new(&path).test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    assert_eq!(hopper.status()[0].version, sha256_hex(&v1));

    kubelet_swap(dir.path(), 2, &v2);
    let (old, new) = wait_for_event(
        &mut events,
        "the swapped version to be loaded",
        |e| match e {
            Event::HandlerReloaded(events::HandlerReloaded {
                old_version,
                new_version,
                ..
            }) => Some((old_version.clone(), new_version.clone())),
            Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. }) => {
                panic!("the swap failed to load: {error}")
            }
            _ => None,
        },
    )
    .await;
    assert_eq!((old, new), (sha256_hex(&v1), sha256_hex(&v2)));

    // A link swapped to a file outside the directory, or to a device, is
    // refused by name, and v2 keeps serving.
    let outside = tempfile::tempdir().unwrap();
    let elsewhere = outside.path().join("handler.wasm");
    std::fs::write(
        &elsewhere,
        with_custom_section(&v1, "hopper-test", b"outside"),
    )
    .unwrap();
    for (target, expected) in [
        (elsewhere.as_path(), "outside its directory"),
        (Path::new("/dev/zero"), "outside its directory"),
    ] {
        let tmp = dir.path().join("handler.wasm.tmp");
        std::os::unix::fs::symlink(target, &tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let error = wait_for_event(
            &mut events,
            "the reload through the link to fail",
            |e| match e {
                Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. }) => {
                    Some(error.clone())
                }
                Event::HandlerReloaded(_) => panic!("a link out of the directory was loaded"),
                _ => None,
            },
        )
        .await;
        assert!(error.contains(expected), "{error}");
        assert_eq!(hopper.status()[0].version, sha256_hex(&v2));
    }
    // A FIFO inside the directory: refused without opening it (which would
    // block), and the stop is not held up.
    let fifo = dir.path().join("..2026_12_05_00_00_02.000000000/pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let tmp = dir.path().join("handler.wasm.tmp");
    std::os::unix::fs::symlink("..data/pipe", &tmp).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let error = wait_for_event(&mut events, "the reload to fail", |e| match e {
        Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. }) => {
            Some(error.clone())
        }
        _ => None,
    })
    .await;
    assert!(error.contains("not a regular file"), "{error}");
    hopper.stop().await;
}

#[test]
fn a_corrupt_cache_entry_is_a_miss_and_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let route = RouteTable::new(&plugin("scripted")).test_route();
    let config = route.config();
    let route = &config.routes[0];
    let bytes = std::fs::read(&route.handler).unwrap();
    let runtime = hopper::plugin::Runtime::new(64 << 20)
        .unwrap()
        .with_cache(dir.path().to_path_buf())
        .unwrap();
    let entry = runtime.cache().unwrap().entry_path(&sha256_hex(&bytes));
    std::fs::write(&entry, b"hopperc1 but nothing a compiler wrote").unwrap();

    let handler = runtime
        .load(&route.handler, route)
        .expect("a corrupt entry is not an error");
    assert!(
        !handler.load_stats().0,
        "compiled, not taken from the corrupt entry"
    );
    assert!(sound_entry(&entry), "the entry was replaced");
    let handler = runtime.load(&route.handler, route).unwrap();
    assert!(handler.load_stats().0, "the replaced entry is used");
    assert_eq!(handler.version(), sha256_hex(&bytes));
}

fn sound_entry(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    bytes.starts_with(b"hopperc1") && bytes.len() > 1024
}

/// A new version of a handler compiles only the functions that changed:
/// the rest comes from the compiled-function cache the version before
/// filled, which outlives the runtime that filled it. The order-timeout
/// handler's v2 is v1 with one more branch (the demo's hot reload).
#[tokio::test]
async fn an_edited_handler_reuses_the_compiled_functions_of_the_version_before() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (plugin("order_timeout"), plugin("order_timeout_v2"));
    let route = resolve_route(RouteTable::new(&v1));
    let runtime = |dir: &Path| {
        hopper::plugin::Runtime::new(64 << 20)
            .unwrap()
            .with_cache(dir.to_path_buf())
            .unwrap()
    };
    let first = runtime(dir.path());
    first.load(&v1, &route).unwrap();
    // Functions that compile to the same code (the component's many alike
    // trampolines) are compiled once even within one version.
    let filled = first.function_stats();
    assert!(filled.misses > 100, "{filled:?}");
    first.load(&v2, &route).unwrap();
    let edited = first.function_stats();
    let (reused, compiled) = (edited.hits - filled.hits, edited.misses - filled.misses);
    // Not only the changed function compiles again: v2's new branch adds
    // strings to the data segment, which moves the addresses that the
    // functions reading later strings load (between 355 reused and 88
    // compiled, and 418 and 25, from one build of the components to the
    // next).
    assert!(
        reused > 2 * compiled && compiled > 0,
        "v2 reused {reused} functions and compiled {compiled}"
    );

    // Another process, its compiled handlers gone: v2 compiles again, its
    // functions from the pack on disk, and runs.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let second = runtime(dir.path());
    let handler = second.load(&v2, &route).unwrap();
    assert!(!handler.load_stats().0, "compiled, not a cached handler");
    // A few functions' keys differ from one engine to the next (the
    // component's trampolines), so this run may compile a few more than
    // the edit did; the code of the handler comes from the pack.
    let stats = second.function_stats();
    assert!(stats.misses * 10 < stats.hits, "{stats:?}");
    assert!(stats.hits + stats.misses >= reused, "{stats:?}");
    let verdict = handler
        .call(hopper::plugin::Delivery {
            id: "edit-1".into(),
            topic: "direct.in".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: Some(b"not json".to_vec()),
            headers: Vec::new(),
            timestamp: None,
            attempt: 1,
            route: "direct".into(),
        })
        .await;
    assert!(
        matches!(verdict, hopper::plugin::Verdict::Fatal { .. }),
        "{verdict:?}"
    );
}
