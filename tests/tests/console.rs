//! The web console end to end, in headless Chromium driven over WebDriver:
//! the token it asks for before it shows anything, dead letters from a real
//! route, filters, a record's detail, an XSS probe that must render as
//! text, a replay that gets handled, and the groups by cause kept current
//! as dead letters arrive.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`./dev` installs them).

use fantoccini::{Client, ClientBuilder, Locator};
use hopper::events::{self, Event};
use hopper_tests::*;
use rdkafka::Message;
use serde_json::json;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Markup that runs script if it is ever parsed as HTML.
const XSS_KEY: &str = "<img src=x onerror=\"window.__xss='key'\">";
const XSS_PAYLOAD: &str =
    "<script>window.__xss='script'</script><img src=x onerror=\"window.__xss='payload'\">";

/// chromedriver on a free loopback port; killed on drop.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Driver {
    fn start() -> Driver {
        let binary = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
            .expect("chromedriver is missing: install Debian's chromium and chromium-driver (./dev does)");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Driver {
            child,
            url: format!("http://{addr}"),
            _profile: tempfile::tempdir().unwrap(),
        }
    }

    async fn browser(&self) -> Client {
        let profile = self._profile.path().display();
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run",
                    format!("--user-data-dir={profile}"),
                ],
            }
        });
        let capabilities = match capabilities {
            serde_json::Value::Object(map) => map,
            _ => unreachable!(),
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("chromium starts under chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `check` holds in the page, failing after a minute.
async fn until<T>(
    browser: &Client,
    what: &str,
    mut check: impl AsyncFnMut(&Client) -> Option<T>,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = check(browser).await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `token` into the token field, presses Replay, and waits for a
/// result that starts with `outcome`: its text.
async fn replay_as(browser: &Client, token: &str, outcome: &str) -> String {
    let field = browser.find(Locator::Id("token")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(token).await.unwrap();
    browser
        .find(Locator::Id("replay"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let what = format!("a replay result starting `{outcome}`");
    until(browser, &what, async |b| {
        let text = text_of(b, "replay-result").await;
        text.starts_with(outcome).then_some(text)
    })
    .await
}

/// The text of each row of the DLQ table, read in one script run so a
/// re-render between reads cannot leave a stale element.
async fn rows(browser: &Client) -> Vec<String> {
    let rows = browser
        .execute(
            "return [...document.querySelectorAll('#dlq-rows tr')].map(r => r.innerText);",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(rows).unwrap()
}

async fn search(browser: &Client, text: &str) {
    let input = browser.find(Locator::Id("filter-text")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
    browser
        .find(Locator::Id("search"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn text_of(browser: &Client, id: &str) -> String {
    let text = browser
        .execute(
            "return document.getElementById(arguments[0]).innerText;",
            vec![json!(id)],
        )
        .await
        .unwrap();
    text.as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_filters_shows_escaped_payloads_and_replays_a_record() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")).config("fixed", "no"))
        .admin(AdminTable::loopback().token(TOKEN))
        .test_route();
    let hopper = route.start().await;
    let producer = producer();
    for id in ["console-1", "console-2"] {
        produce(
            &producer,
            &route.input,
            Some(id),
            "config:fixed=yes",
            &[("hopper-id", id)],
        )
        .await;
    }
    produce(
        &producer,
        &route.input,
        Some(XSS_KEY),
        XSS_PAYLOAD,
        &[("hopper-id", "xss")],
    )
    .await;
    let dead = consume(&route.dlq, 3, PATIENCE).await;
    hopper.stop().await;
    // The cause is fixed; the console replays.
    let text = std::fs::read_to_string(&route.config_path).unwrap();
    std::fs::write(
        &route.config_path,
        text.replace("fixed = \"no\"", "fixed = \"yes\""),
    )
    .unwrap();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let console = format!("http://{}/", hopper.admin_addr().unwrap());

    let driver = Driver::start();
    let browser = driver.browser().await;
    browser.goto(&console).await.unwrap();
    // With a token configured, reads need it too: the console asks for it
    // and shows nothing until it has it.
    let asked = until(&browser, "a request for the token", async |b| {
        let text = text_of(b, "error").await;
        text.contains("admin token").then_some(text)
    })
    .await;
    assert!(asked.contains("Authorization: Bearer"), "{asked}");
    assert!(
        rows(&browser).await.is_empty(),
        "dead letters shown without the token"
    );
    let token = browser.find(Locator::Id("token")).await.unwrap();
    token.send_keys(&format!("{TOKEN}\u{e004}")).await.unwrap();
    until(&browser, "3 dead letters", async |b| {
        (rows(b).await.len() == 3).then_some(())
    })
    .await;
    until(&browser, "the handler's version", async |b| {
        text_of(b, "handlers")
            .await
            .contains(&route.name)
            .then_some(())
    })
    .await;
    let histogram = browser
        .find_all(Locator::Css("#histogram svg rect"))
        .await
        .unwrap();
    assert!(!histogram.is_empty(), "a histogram of reasons");

    // Filter on the error text.
    search(&browser, "config fixed").await;
    let found = until(&browser, "2 matches", async |b| {
        let rows = rows(b).await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    assert!(
        found
            .iter()
            .all(|r| r.contains("FATAL") && r.contains("console-")),
        "{found:?}"
    );

    // The XSS probe: shown as text in the list and the detail, never run.
    search(&browser, "unknown command").await;
    until(&browser, "the probe", async |b| {
        (rows(b).await.len() == 1).then_some(())
    })
    .await;
    let row = browser.find(Locator::Css("#dlq-rows tr")).await.unwrap();
    assert!(row.text().await.unwrap().contains(XSS_KEY));
    row.click().await.unwrap();
    let payload = until(&browser, "the payload", async |b| {
        let text = text_of(b, "payload").await;
        (!text.is_empty()).then_some(text)
    })
    .await;
    assert_eq!(payload, XSS_PAYLOAD);
    let injected = browser
        .execute("return [document.querySelectorAll('img, script:not([src])').length, window.__xss === undefined];", vec![])
        .await
        .unwrap();
    assert_eq!(
        injected,
        json!([0, true]),
        "markup from a record was parsed as HTML"
    );
    browser
        .find(Locator::Css("button[data-view=hex]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(
        text_of(&browser, "payload")
            .await
            .starts_with("3c 73 63 72"),
        "hex of `<scr`"
    );
    browser
        .find(Locator::Css("button[data-view=json]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text_of(&browser, "payload").await, "(not JSON)");

    // Select one record and replay it: first with a wrong token.
    search(&browser, "config fixed").await;
    until(&browser, "2 matches", async |b| {
        (rows(b).await.len() == 2).then_some(())
    })
    .await;
    let first = browser
        .find(Locator::Css("#dlq-rows tr input.select"))
        .await
        .unwrap();
    let chosen = first.attr("data-ref").await.unwrap().unwrap();
    first.click().await.unwrap();
    let refused = replay_as(&browser, "not-the-token", "refused").await;
    assert!(refused.contains("token is wrong"), "{refused}");
    let result = replay_as(&browser, TOKEN, "replayed").await;
    assert!(result.starts_with("replayed 1,"), "{result}");

    // Hopper handles it again, and the console counts the replay.
    let id = dead
        .iter()
        .find(|m| format!("{}:{}:{}", m.topic(), m.partition(), m.offset()) == chosen)
        .map(|m| String::from_utf8(m.key().unwrap().to_vec()).unwrap())
        .expect("the chosen record is one of the dead letters");
    let verdict = wait_for_event(
        &mut events,
        "the call of the replayed record",
        |e| match e {
            Event::Handled(events::Handled {
                id: got, verdict, ..
            }) if *got == id => Some(*verdict),
            _ => None,
        },
    )
    .await;
    assert_eq!(verdict, "ok");
    // The list reloads after a replay; its `replayed` column says 1.
    until(&browser, "the replay count", async |b| {
        let cells = b
            .execute(
                "return [...document.querySelectorAll('#dlq-rows tr')].map(r => [r.children[4].textContent, r.children[7].textContent]);",
                vec![],
            )
            .await
            .unwrap();
        cells
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c[0] == id.as_str() && c[1] == "1")
            .then_some(())
    })
    .await;
    browser.close().await.unwrap();
    hopper.stop().await;
}

/// Without a configured token, the console reads with the session token
/// that comes in the URL hopper logs: without it, nothing is shown; with it
/// in the fragment, the dead letters are, the fragment leaves the address
/// bar, and a reload of the tab keeps reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_reads_with_the_session_token_from_its_url() {
    init_tracing();
    if std::env::var_os("HOPPER_ADMIN_TOKEN").is_some() {
        return; // the environment gives a token; this case cannot be set up
    }
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback())
        .test_route();
    let hopper = route.start().await;
    produce(
        &producer(),
        &route.input,
        Some("s"),
        "fatal",
        &[("hopper-id", "session-1")],
    )
    .await;
    consume(&route.dlq, 1, PATIENCE).await;
    let console = format!("http://{}/", hopper.admin_addr().unwrap());
    let session = hopper.admin_session_token().unwrap().to_string();

    let driver = Driver::start();
    let browser = driver.browser().await;
    browser.goto(&console).await.unwrap();
    let asked = until(&browser, "a request for the token", async |b| {
        let text = text_of(b, "error").await;
        text.contains("admin token").then_some(text)
    })
    .await;
    assert!(asked.contains("console URL hopper logged"), "{asked}");
    assert!(rows(&browser).await.is_empty(), "shown without the token");

    browser
        .goto(&format!("{console}#token={session}"))
        .await
        .unwrap();
    browser.refresh().await.unwrap();
    until(&browser, "the dead letter", async |b| {
        (rows(b).await.len() == 1).then_some(())
    })
    .await;
    let url = browser.current_url().await.unwrap();
    assert!(
        !url.as_str().contains(&session),
        "the token stayed in {url}"
    );
    browser.refresh().await.unwrap();
    until(&browser, "the dead letter after a reload", async |b| {
        (rows(b).await.len() == 1).then_some(())
    })
    .await;
    browser.close().await.unwrap();
    hopper.stop().await;
}

/// Without `admin.allow_code_upload`, "Try a fix" says that uploading a
/// candidate is off on this server and names the key, and its button is
/// disabled, rather than offer a try the server can only refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_a_fix_says_when_uploading_code_is_off() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .admin(AdminTable::loopback().token(TOKEN))
        .test_route();
    let hopper = route.start().await;
    let console = format!("http://{}/", hopper.admin_addr().unwrap());
    let driver = Driver::start();
    let browser = driver.browser().await;
    browser
        .goto(&format!("{console}#token={TOKEN}"))
        .await
        .unwrap();
    let note = until(&browser, "the note that uploading is off", async |b| {
        let shown = b
            .execute(
                "const off = document.getElementById('try-off'); \
                 return [off.hidden, document.getElementById('try').disabled, off.innerText];",
                vec![],
            )
            .await
            .unwrap();
        let (hidden, disabled, text): (bool, bool, String) = serde_json::from_value(shown).unwrap();
        (!hidden && disabled).then_some(text)
    })
    .await;
    assert!(note.contains("admin.allow_code_upload"), "{note}");
    browser.close().await.unwrap();
    hopper.stop().await;
}

/// The dead-letter view opens on the groups the admin server keeps as dead
/// letters arrive: a new one is counted without a search, a group's
/// records are one click away, and a group is replayed after a dry run
/// that produces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_view_counts_causes_as_they_come_and_replays_a_group_after_a_dry_run() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")).config("fixed", "no"))
        .admin(AdminTable::loopback().token(TOKEN))
        // One replay a second: the group's replay of three runs 2 s at
        // least, so the console shows it running before it is done.
        .replay(3, 1)
        .test_route();
    let hopper = route.start().await;
    let producer = producer();
    for id in ["g-fix-1", "g-fix-2", "g-fix-3"] {
        let payload = "config:fixed=yes";
        produce(
            &producer,
            &route.input,
            Some(id),
            payload,
            &[("hopper-id", id)],
        )
        .await;
    }
    for id in ["g-fatal-1", "g-fatal-2"] {
        produce(
            &producer,
            &route.input,
            Some(id),
            "fatal",
            &[("hopper-id", id)],
        )
        .await;
    }
    consume(&route.dlq, 5, PATIENCE).await;
    hopper.stop().await;
    let text = std::fs::read_to_string(&route.config_path).unwrap();
    std::fs::write(
        &route.config_path,
        text.replace("fixed = \"no\"", "fixed = \"yes\""),
    )
    .unwrap();
    let hopper = route.start().await;
    let mut events = hopper.events();
    let addr = hopper.admin_addr().unwrap();

    // The API: the groups of a route, from memory; an unknown route is
    // named.
    let (status, body) = http(addr, "GET", "/api/dlq/groups?route=nope", Some(TOKEN), None).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("route `nope` is not in the config"), "{body}");
    let path = format!("/api/dlq/groups?route={}", route.name);
    let page = until_json(addr, &path, |p| p["caught_up"] == true && p["total"] == 5).await;
    assert_eq!(page["group_count"], 2, "{page:#}");

    let driver = Driver::start();
    let browser = driver.browser().await;
    browser.goto(&format!("http://{addr}/")).await.unwrap();
    let token = browser.find(Locator::Id("token")).await.unwrap();
    token.send_keys(&format!("{TOKEN}\u{e004}")).await.unwrap();
    let groups = until(&browser, "two groups", async |b| {
        let rows = group_rows(b).await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    assert!(
        groups
            .iter()
            .any(|r| r.starts_with("3\t") && r.contains("config fixed")),
        "{groups:?}"
    );
    let bars = browser
        .find_all(Locator::Css("#groups svg.sparkline rect"))
        .await
        .unwrap();
    assert!(bars.len() >= 2, "a sparkline per group");

    // A new dead letter is counted as it comes (the view refreshes itself).
    produce(
        &producer,
        &route.input,
        Some("g-fatal-3"),
        "fatal",
        &[("hopper-id", "g-fatal-3")],
    )
    .await;
    until(&browser, "the third `told to fail`", async |b| {
        group_rows(b)
            .await
            .iter()
            .any(|r| r.starts_with("3\t") && r.contains("told to fail"))
            .then_some(())
    })
    .await;

    // One click lists a group's records.
    click_in_group(&browser, "told to fail", "button.group-records").await;
    let records = until(&browser, "the group's 3 records", async |b| {
        let rows = rows(b).await;
        (rows.len() == 3).then_some(rows)
    })
    .await;
    assert!(
        records.iter().all(|r| r.contains("told to fail")),
        "{records:?}"
    );

    // A replay of the other group: a dry run that produces nothing, then
    // the replay, each record handled again.
    let size = || {
        hopper::lag::topic_size(
            &hopper::kafka::Cluster::new(brokers(), Default::default()),
            &route.input,
        )
        .unwrap()
    };
    let before = size();
    click_in_group(&browser, "config fixed", "button.group-replay").await;
    // Each is a run: the console follows its status until it is done.
    let planned = until(&browser, "the dry run", async |b| {
        let text = text_of(b, "group-replay").await;
        (text.contains("dry run") && text.contains(": done:")).then_some(text)
    })
    .await;
    assert!(planned.contains("would replay 3,"), "{planned}");
    assert_eq!(size(), before, "a dry run produced");
    browser
        .find(Locator::Id("group-replay-confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let running = until(&browser, "the replay running", async |b| {
        let text = text_of(b, "group-replay").await;
        text.contains(": replay (run ").then_some(text)
    })
    .await;
    assert!(running.contains(": running: replayed "), "{running}");
    let done = until(&browser, "the replay", async |b| {
        let text = text_of(b, "group-replay").await;
        (text.contains(": replay (run ") && !text.contains(": running:")).then_some(text)
    })
    .await;
    assert!(
        done.contains(": done: replayed 3, loop guard 0, skipped 0, failed 0"),
        "{done}"
    );
    let mut handled = std::collections::BTreeSet::new();
    while handled.len() < 3 {
        let id = wait_for_event(&mut events, "a replayed record handled", |e| match e {
            Event::Handled(events::Handled { id, verdict, .. })
                if id.starts_with("g-fix-") && *verdict == "ok" =>
            {
                Some(id.clone())
            }
            _ => None,
        })
        .await;
        handled.insert(id);
    }
    assert_eq!(size(), before + 3);
    browser.close().await.unwrap();
    hopper.stop().await;
}

/// The text of each row of the groups table, cells joined by tabs.
async fn group_rows(browser: &Client) -> Vec<String> {
    let rows = browser
        .execute(
            "return [...document.querySelectorAll('#groups tr')].map(r => [...r.children].map(c => c.textContent).join('\\t'));",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(rows).unwrap()
}

/// Clicks `button` in the group row whose text has `text`.
async fn click_in_group(browser: &Client, text: &str, button: &str) {
    let clicked = browser
        .execute(
            "const row = [...document.querySelectorAll('#groups tr')].find(r => r.textContent.includes(arguments[0]));
             if (!row) return false;
             row.querySelector(arguments[1]).click();
             return true;",
            vec![json!(text), json!(button)],
        )
        .await
        .unwrap();
    assert_eq!(clicked, json!(true), "no group row with `{text}`");
}

/// `GET path` until `done` holds of its JSON.
async fn until_json(
    addr: SocketAddr,
    path: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let page = get_json_as(addr, path, Some(TOKEN)).await;
        if done(&page) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {path}: {page:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
