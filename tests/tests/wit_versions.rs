//! Components built against earlier releases of the handler world keep
//! loading and running unchanged: `plugins/fixtures/legacy-0-1-0` is built
//! against `hopper:handler@0.1.0` (`log` and `config` only) and
//! `legacy-0-1-1` against 0.1.1 (`emit` with `publish` only, `secrets`),
//! `legacy-0-1-2` against 0.1.2 (`emit.schedule` and `emit.cancel`).
//! Hopper links 0.1.3, which adds the `http` interface (`fetch`);
//! wasmtime's linker serves a 0.1.x import from 0.1.3 because each 0.1.x
//! only adds.

use hopper::plugin::{Runtime, Verdict};
use hopper_tests::*;
use rdkafka::Message;
use std::time::Duration;

/// The world's imports of a component, as it names them (with version).
fn hopper_imports(name: &str) -> Vec<String> {
    let fit = Runtime::new(64 << 20)
        .unwrap()
        .with_cache(cache_dir())
        .unwrap()
        .fit(&plugin(name))
        .unwrap();
    assert!(fit.fits(), "{name}: {:?}", fit.error);
    let mut imports: Vec<String> = fit
        .imports
        .into_iter()
        .filter(|i| i.starts_with("hopper:handler/"))
        .collect();
    imports.sort();
    imports
}

#[test]
fn the_fixtures_are_built_against_the_releases_they_are_named_for() {
    // What makes the tests below about old components: had a fixture been
    // rebuilt against today's WIT, its imports would say 0.1.3.
    assert_eq!(
        hopper_imports("legacy_0_1_0"),
        vec![
            "hopper:handler/config@0.1.0",
            "hopper:handler/log@0.1.0",
            "hopper:handler/types@0.1.0",
        ]
    );
    assert_eq!(
        hopper_imports("legacy_0_1_1"),
        vec![
            "hopper:handler/config@0.1.1",
            "hopper:handler/emit@0.1.1",
            "hopper:handler/secrets@0.1.1",
            "hopper:handler/types@0.1.1",
        ]
    );
    assert_eq!(
        hopper_imports("legacy_0_1_2"),
        vec![
            "hopper:handler/config@0.1.2",
            "hopper:handler/emit@0.1.2",
            "hopper:handler/types@0.1.2",
        ]
    );
    let today = hopper_imports("acting");
    for import in ["hopper:handler/emit@0.1.3", "hopper:handler/http@0.1.3"] {
        assert!(
            today.contains(&import.to_string()),
            "a component built from wit/ today imports {import}: {today:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_2_component_schedules_and_cancels_through_the_0_1_3_emit() {
    let legacy = InProcess::with_config(
        RouteTable::new(&plugin("legacy_0_1_2"))
            .emit_topics(&["timeouts"])
            .cancel_ids(&["timeout-*", "cancel-*"])
            .config("topic", "timeouts"),
        ConfigBuilder::new().delay(DelayTable::default().max_delay("1h")),
    );
    let handled = legacy.handler.run(legacy.delivery("m-1", "schedule")).await;
    assert_eq!(handled.verdict, Verdict::Ok);
    assert_eq!(handled.emitted.len(), 2, "{:?}", handled.emitted);
    assert_eq!(handled.emitted[0].key.as_deref(), Some(&b"timeout-m-1"[..]));
    assert_eq!(
        handled.emitted[0].payload.as_deref(),
        Some(&b"from 0.1.2"[..])
    );
    assert_eq!(handled.emitted[1].key.as_deref(), Some(&b"cancel-m-1"[..]));

    // Its refusals are still 0.1.2's `schedule-error`.
    let refused = InProcess::with_config(
        RouteTable::new(&plugin("legacy_0_1_2"))
            .emit_topics(&["timeouts"])
            .config("topic", "timeouts"),
        ConfigBuilder::new().delay(DelayTable::default().max_delay("1h")),
    );
    assert_eq!(
        refused
            .handler
            .call(refused.delivery("m-2", "schedule"))
            .await,
        Verdict::Fatal {
            reason: "schedule refused: ScheduleError::IdNotGranted(\"timeout-m-2\")".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_component_gets_its_config_and_returns_every_verdict() {
    let legacy = InProcess::new(RouteTable::new(&plugin("legacy_0_1_0")).config("name", "billing"));
    let handled = legacy.handler.run(legacy.delivery("m-1", "ok")).await;
    assert_eq!(handled.verdict, Verdict::Ok);
    assert!(handled.emitted.is_empty());
    assert_eq!(
        legacy.handler.call(legacy.delivery("m-2", "retry")).await,
        Verdict::Retryable {
            reason: "asked to retry".into(),
            retry_after: Some(Duration::from_millis(1500)),
        }
    );
    assert_eq!(
        legacy.handler.call(legacy.delivery("m-3", "no")).await,
        Verdict::Fatal {
            reason: "billing refuses m-3 on attempt 1".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_1_component_publishes_through_the_0_1_2_emit() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken").unwrap();
    let legacy = InProcess::new(
        RouteTable::new(&plugin("legacy_0_1_1"))
            .emit_topics(&["closed"])
            .config("topic", "closed")
            .secret("token", format!("file:{}", token.display())),
    );
    let handled = legacy.handler.run(legacy.delivery("m-1", "emit")).await;
    assert_eq!(handled.verdict, Verdict::Ok);
    assert_eq!(handled.emitted.len(), 1);
    let record = &handled.emitted[0];
    assert_eq!(record.id, "m-1/emit/0");
    assert_eq!(record.topic, "closed");
    assert_eq!(record.payload.as_deref(), Some(&b"from 0.1.1"[..]));
    assert_eq!(
        record.headers,
        vec![("secret-name".to_string(), b"granted".to_vec())]
    );

    // Its refusals are still 0.1.1's `emit-error`.
    let refused =
        InProcess::new(RouteTable::new(&plugin("legacy_0_1_1")).config("topic", "closed"));
    assert_eq!(
        refused.handler.call(refused.delivery("m-2", "emit")).await,
        Verdict::Fatal {
            reason: "emit refused: EmitError::TopicNotGranted(\"closed\")".into()
        }
    );
}

/// Both old components as the handlers of real routes: messages committed,
/// dead-lettered and emitted as they were before 0.1.2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_components_run_as_routes_on_a_broker() {
    init_tracing();
    let (old, older) = (rand_name("legacy11"), rand_name("legacy10"));
    let closed = rand_name("closed");
    let config = ConfigBuilder::new()
        .route(
            RouteTable::named(&old, &plugin("legacy_0_1_1"))
                .emit_topics(&[&closed])
                .config("topic", &closed),
        )
        .route(RouteTable::named(&older, &plugin("legacy_0_1_0")).config("name", "billing"))
        .write();
    let hopper = config.start().await;
    let producer = producer();
    produce(
        &producer,
        &format!("{old}.in"),
        Some("o-1"),
        "emit",
        &[("hopper-id", "e-1")],
    )
    .await;
    produce(
        &producer,
        &format!("{older}.in"),
        None,
        "no",
        &[("hopper-id", "f-1")],
    )
    .await;

    let emitted = consume(&closed, 1, PATIENCE).await;
    assert_eq!(emitted[0].key(), Some(&b"o-1"[..]));
    assert_eq!(emitted[0].payload(), Some(&b"from 0.1.1"[..]));
    let (h, _) = header_map(&emitted[0]);
    assert_eq!(h["hopper-id"], "e-1/emit/0");
    assert_eq!(h["hopper-route"], old);
    assert_eq!(h["secret-name"], "none");

    let dead = consume(&format!("{older}.dlq"), 1, PATIENCE).await;
    let (h, _) = header_map(&dead[0]);
    assert_eq!(h["hopper-id"], "f-1");
    assert_eq!(h["hopper-reason"], "FATAL");
    assert_eq!(h["hopper-last-error"], "billing refuses f-1 on attempt 1");
    hopper.stop().await;
}
