//! `hopper dev`: the handler development loop, in a project made by
//! `hopper plugin new`. It serves the project's handler on a route of the
//! embedded broker, and on each change to the project's sources rebuilds
//! it (`build.sh`), runs its cases (`cases.toml`, the `hopper plugin test`
//! runner) and, only when both pass, swaps the new version in through the
//! route's hot reload. A failed build or case leaves the old version
//! serving.
//!
//! Messages come from stdin, one a line, or from a file replayed a bounded
//! number of times (`--messages`).

use crate::demo::describe;
use crate::test_cases::{Piece, Ran, Suite, millis};
use crate::{Signals, prepare};
use anyhow::{Context as _, bail};
use clap::Args;
use hopper::events::{self, Event};
use hopper::kafka::Cluster;
use hopper::plugin::Compiler;
use hopper::{Hopper, Options, headers, hop};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

#[derive(Args)]
pub struct DevArgs {
    /// The handler project: a directory made by `hopper plugin new`.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Also send the messages of this file, one a line (`KEY: PAYLOAD`, or
    /// a payload without a key; empty lines and lines starting with `#` are
    /// skipped), once the first version serves.
    #[arg(long)]
    messages: Option<PathBuf>,
    /// How many times the messages of --messages are sent, in order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// The pause between two messages of --messages (humantime: 500ms, 2s).
    #[arg(long, default_value = "1s")]
    interval: humantime::Duration,
}

/// How long the sources must be quiet before a change is built: editors
/// and formatters write in bursts.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Longest a build may take before it is stopped and counted as failed.
const BUILD_LIMIT: Duration = Duration::from_secs(900);

/// Longest the route's hot reload may take to swap a passed version in
/// before `hopper dev` asks the route what it serves.
const SWAP_LIMIT: Duration = Duration::from_secs(60);

/// At most this many lines of a failed build's output are shown (its end).
const BUILD_LINES: usize = 200;

/// Directories that hold build output, never sources.
const OUTPUT_DIRS: [&str; 7] = [
    "target",
    "build",
    "node_modules",
    "__pycache__",
    ".git",
    ".venv",
    "venv",
];

/// The files of a project that `hopper dev` needs.
struct Project {
    dir: PathBuf,
    /// The component `build.sh` writes, `NAME.wasm`.
    wasm: PathBuf,
    name: String,
    build: PathBuf,
    cases: PathBuf,
}

impl Project {
    /// The project in `dir`, or an error that names what is missing.
    fn find(dir: &Path) -> anyhow::Result<Project> {
        let dir = std::path::absolute(dir)
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        if !dir.is_dir() {
            bail!(
                "{} is not a directory: run `hopper dev` in a handler project (`hopper plugin new` makes one)",
                dir.display()
            );
        }
        let need = |file: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(file);
            if path.is_file() {
                Ok(path)
            } else {
                bail!(
                    "{} is not a handler project: it has no {file} (a project made by `hopper plugin new` has build.sh, test.sh and cases.toml)",
                    dir.display()
                )
            }
        };
        let build = need("build.sh")?;
        let cases = need("cases.toml")?;
        let test = need("test.sh")?;
        let script = std::fs::read_to_string(&test)
            .with_context(|| format!("reading {}", test.display()))?;
        // test.sh runs `hopper plugin test NAME.wasm cases.toml`.
        let name = script
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .find_map(|l| {
                let (_, rest) = l.split_once("plugin test ")?;
                let file = rest.split_whitespace().next()?;
                let stem = file.strip_suffix(".wasm")?;
                (!stem.is_empty() && !stem.contains('/')).then(|| stem.to_string())
            })
            .with_context(|| {
                format!(
                    "{} does not name the component it tests (`hopper plugin test NAME.wasm cases.toml`)",
                    test.display()
                )
            })?;
        Ok(Project {
            wasm: dir.join(format!("{name}.wasm")),
            dir,
            name,
            build,
            cases,
        })
    }

    /// Whether a change to `path` is a change to the sources: not build
    /// output (the component, `target/`, `build/`, ...), not an editor's
    /// temporary file.
    fn is_source(&self, path: &Path) -> bool {
        let Ok(relative) = path.strip_prefix(&self.dir) else {
            return false;
        };
        let mut parts = relative.components().peekable();
        while let Some(part) = parts.next() {
            let Component::Normal(part) = part else {
                return false;
            };
            let part = part.to_string_lossy();
            if OUTPUT_DIRS.contains(&part.as_ref()) {
                return false;
            }
            if parts.peek().is_none() {
                return !(part.starts_with('.')
                    || part.starts_with('#')
                    || part.ends_with('~')
                    || part.ends_with(".wasm")
                    || part.ends_with(".tmp")
                    || part.ends_with(".swp")
                    || part == "Cargo.lock"
                    || part == "4913");
            }
        }
        false
    }
}

/// A message to send: `KEY: PAYLOAD`, or a payload. A key is a word of
/// letters, digits, `-`, `_` and `.` right before the colon; anything else
/// (`{"a": 1}`) is all payload.
fn parse_message(line: &str) -> (Option<&str>, &str) {
    if let Some((key, payload)) = line.split_once(": ")
        && !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return (Some(key), payload);
    }
    (None, line)
}

fn read_messages(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read messages file {}", path.display()))?;
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    if lines.is_empty() {
        bail!(
            "messages file {} has no message: write one a line, `KEY: PAYLOAD` or a payload",
            path.display()
        );
    }
    Ok(lines)
}

/// The config `hopper dev` serves: the cases file's `[route]` table (its
/// limits and grants), named `dev` unless it has a name, reading
/// `NAME.in`, with the handler at `live`, on the embedded broker.
fn config_text(cases: &Path, live: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(cases).with_context(|| format!("reading {}", cases.display()))?;
    let file: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("cases file {} does not parse: {e}", cases.display()))?;
    let mut route = match file.get("route") {
        Some(toml::Value::Table(table)) => table.clone(),
        Some(_) => bail!("cases file {}: [route] is not a table", cases.display()),
        None => toml::Table::new(),
    };
    let name = route
        .get("name")
        .and_then(toml::Value::as_str)
        .unwrap_or("dev")
        .to_string();
    route.insert("name".into(), name.clone().into());
    route
        .entry("topics")
        .or_insert_with(|| toml::Value::Array(vec![format!("{name}.in").into()]));
    route.insert("handler".into(), live.to_string_lossy().into_owned().into());
    let mut kafka = toml::Table::new();
    kafka.insert("embedded".into(), true.into());
    let mut document = toml::Table::new();
    document.insert("kafka".into(), kafka.into());
    document.insert("route".into(), toml::Value::Array(vec![route.into()]));
    // As `hopper plugin test` resolves the route: delayed emits,
    // schedules and cancels can be granted.
    document.insert("delay".into(), toml::Table::new().into());
    Ok(toml::to_string(&document)?)
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    use sha2::Digest as _;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(sha2::Sha256::digest(&bytes)))
}

/// A version that built and passed its cases, copied beside the live file.
struct Passed {
    next: PathBuf,
    version: String,
    build: Duration,
    test: Duration,
    ran: Ran,
}

/// Kills a build's process group (the script and the compilers it
/// started) when dropped before the build ended: on Ctrl-C or SIGTERM.
struct Group(Option<rustix::process::Pid>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
        }
    }
}

/// Runs `build.sh`; prints its output when it fails.
async fn build(project: &Project) -> Result<Duration, ()> {
    let started = Instant::now();
    let mut command = tokio::process::Command::new(&project.build);
    command
        .current_dir(&project.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            println!("  cannot run {}: {e}", project.build.display());
            return Err(());
        }
    };
    let mut group = Group(
        child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
    );
    let output = tokio::time::timeout(BUILD_LIMIT, child.wait_with_output()).await;
    let output = match output {
        Ok(Ok(output)) => {
            group.0 = None;
            output
        }
        Ok(Err(e)) => {
            println!("  {} failed to run: {e}", project.build.display());
            return Err(());
        }
        Err(_) => {
            println!(
                "  {} ran past {}: stopped",
                project.build.display(),
                humantime::format_duration(BUILD_LIMIT)
            );
            return Err(());
        }
    };
    let took = started.elapsed();
    if output.status.success() && project.wasm.is_file() {
        return Ok(took);
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let why = if output.status.success() {
        format!("exited 0 but wrote no {}", project.wasm.display())
    } else {
        format!("failed ({})", output.status)
    };
    println!("  build.sh {why} in {}; its output:", millis(took));
    if lines.len() > BUILD_LINES {
        println!("  | ... ({} lines before)", lines.len() - BUILD_LINES);
    }
    for line in &lines[lines.len().saturating_sub(BUILD_LINES)..] {
        println!("  | {line}");
    }
    Err(())
}

/// Builds, runs the cases and copies what passed to `next`. What failed is
/// printed; `Err` says only that it failed.
async fn pass(
    project: std::sync::Arc<Project>,
    next: PathBuf,
    cache_dir: Option<PathBuf>,
    compiler: Compiler,
) -> Result<Passed, ()> {
    let build = build(&project).await?;
    println!("  built in {}; running the cases", millis(build));
    let suite = Suite {
        handler: project.wasm.clone(),
        cases: project.cases.clone(),
        from_config: None,
        filter: None,
        junit: None,
        cache_dir,
        compiler,
    };
    let started = Instant::now();
    // Only failures are shown, as `hopper plugin test` shows them.
    let ran = suite
        .run_apart(|piece| match piece {
            Piece::Line(line) => println!("  {line}"),
            Piece::Case {
                passed: false,
                lines,
            } => lines.iter().for_each(|l| println!("  {l}")),
            Piece::Case { passed: true, .. } => {}
        })
        .await;
    let test = started.elapsed();
    let ran = match ran {
        Ok(ran) if ran.failed == 0 => ran,
        Ok(_) => return Err(()),
        Err(e) => {
            println!("  the cases cannot run: {e:#}");
            return Err(());
        }
    };
    // Swap in exactly what was tested.
    let copied = std::fs::copy(&project.wasm, &next)
        .map_err(anyhow::Error::from)
        .and_then(|_| sha256(&next));
    match copied {
        Ok(version) if version == ran.version => Ok(Passed {
            next,
            version,
            build,
            test,
            ran,
        }),
        Ok(_) => {
            println!(
                "  {} changed while its cases ran; not swapped in",
                project.wasm.display()
            );
            Err(())
        }
        Err(e) => {
            println!("  cannot copy {}: {e:#}", project.wasm.display());
            Err(())
        }
    }
}

/// A build and test in progress.
type Running = Pin<Box<JoinHandle<Result<Passed, ()>>>>;

/// What is serving: hopper on the embedded broker.
struct Serving {
    hopper: Hopper,
    _broker: Option<hopper::embedded::EmbeddedBroker>,
    producer: FutureProducer,
    input: String,
    events: tokio::sync::broadcast::Receiver<Event>,
}

impl Serving {
    async fn start(
        config: &Path,
        cache_dir: Option<PathBuf>,
        compiler: Compiler,
    ) -> anyhow::Result<Serving> {
        let (settings, broker) =
            prepare(config, None, true).with_context(|| format!("loading {}", config.display()))?;
        let route = settings
            .routes
            .first()
            .context("the dev config has no route")?;
        let input = route.topics[0].clone();
        println!("{} Config: {}.", describe(route), config.display());
        let producer = Cluster::of(&settings.kafka)?.producer()?;
        let hopper = Hopper::start(
            settings,
            Options {
                cache_dir,
                compiler,
                ..Options::default()
            },
        )
        .await?;
        let events = hopper.events();
        Ok(Serving {
            hopper,
            _broker: broker,
            producer,
            input,
            events,
        })
    }

    async fn send(&self, id: &str, line: &str) -> anyhow::Result<()> {
        let (key, payload) = parse_message(line);
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: headers::ID,
            value: Some(id),
        });
        let mut record = FutureRecord::to(&self.input)
            .payload(payload)
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .with_context(|| format!("sending {id} to {}", self.input))?;
        Ok(())
    }
}

/// Source changes, from notify's thread.
fn watch(
    project: std::sync::Arc<Project>,
    changes: mpsc::UnboundedSender<PathBuf>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    use notify::{EventKind, RecursiveMode, Watcher as _};
    let dir = project.dir.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let writes = match event.kind {
            EventKind::Create(_) | EventKind::Remove(_) => true,
            EventKind::Modify(ModifyKind::Metadata(_)) => false,
            EventKind::Modify(_) => true,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            _ => false,
        };
        if writes {
            for path in event.paths {
                if project.is_source(&path) {
                    let _ = changes.send(path);
                }
            }
        }
    })
    .context("cannot start the source watcher")?;
    watcher
        .watch(&dir, RecursiveMode::Recursive)
        .with_context(|| format!("cannot watch {}", dir.display()))?;
    Ok(watcher)
}

/// Stdin, one line a message, from a thread of its own: a read that
/// blocks must not hold up the runtime's shutdown.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn maybe<T>(future: Option<&mut Pin<Box<T>>>) -> T::Output
where
    T: std::future::Future + ?Sized,
{
    match future {
        Some(future) => future.as_mut().await,
        None => std::future::pending().await,
    }
}

pub async fn run(
    args: DevArgs,
    cache_dir: Option<PathBuf>,
    compiler: Compiler,
) -> anyhow::Result<()> {
    let project = std::sync::Arc::new(Project::find(&args.dir)?);
    let mut feed = match &args.messages {
        Some(path) => Some(read_messages(path)?),
        None => None,
    };
    let rounds = args.rounds as usize;
    let interval: Duration = args.interval.into();
    let mut signals = Signals::new()?;
    let live_dir = tempfile::Builder::new().prefix("hopper-dev-").tempdir()?;
    let live = live_dir.path().join(format!("{}.wasm", project.name));
    let next = live_dir.path().join(format!(".{}.wasm.next", project.name));
    let config = live_dir.path().join("hopper.toml");
    std::fs::write(&config, config_text(&project.cases, &live)?)
        .with_context(|| format!("writing {}", config.display()))?;

    let started = Instant::now();
    let stamp = move || format!("[{:>7.2}s]", started.elapsed().as_secs_f64());
    println!(
        "Developing {} in {}: on each change to its sources, build.sh, then the cases of cases.toml, then the new version serves. Compiled by {compiler}{}. Ctrl-C stops.",
        project.name,
        project.dir.display(),
        match compiler {
            Compiler::Winch =>
                " (quick to compile; `--compiler cranelift` for the code production runs)",
            Compiler::Cranelift => "",
        }
    );
    // Watching starts before the first build, so that no edit is missed.
    let (changes_tx, mut changes) = mpsc::unbounded_channel();
    let _watcher = watch(project.clone(), changes_tx)?;
    let mut stdin = stdin_lines();
    let mut stdin_open = true;

    let mut serving: Option<Serving> = None;
    // sha256 → version number, for the versions that served.
    let mut versions: HashMap<String, usize> = HashMap::new();
    let mut current: Option<String> = None;
    let mut quiet: Option<Pin<Box<Sleep>>> = None;
    let mut dirty = false;
    // A swap written, waiting for the route to reload: when, and what.
    let mut swapping: Option<(Instant, Passed)> = None;
    let mut swap_deadline: Option<Pin<Box<Sleep>>> = None;
    let mut sent = 0usize;
    let mut fed = 0usize;
    let mut feed_timer: Option<Pin<Box<Sleep>>> = None;
    let mut change = 1usize;

    println!("{} change 1: the first build", stamp());
    let mut running: Option<Running> = Some(Box::pin(tokio::spawn(pass(
        project.clone(),
        next.clone(),
        cache_dir.clone(),
        compiler,
    ))));

    let version_of = |versions: &HashMap<String, usize>, sha: &str| match versions.get(sha) {
        Some(n) => format!("v{n} ({})", &sha[..12.min(sha.len())]),
        None => format!("({})", &sha[..12.min(sha.len())]),
    };
    let keeps = |current: &Option<String>, versions: &HashMap<String, usize>| match current {
        Some(sha) => format!("{} keeps serving", version_of(versions, sha)),
        None => "nothing serves until a version builds and passes its cases".to_string(),
    };

    loop {
        if quiet.is_none() && running.is_none() && swapping.is_none() && dirty {
            dirty = false;
            quiet = Some(Box::pin(tokio::time::sleep(DEBOUNCE)));
        }
        tokio::select! {
            signal = signals.next() => {
                println!("{} {}: stopping", stamp(), signal.name);
                break;
            }
            Some(path) = changes.recv() => {
                let shown = path.strip_prefix(&project.dir).unwrap_or(&path);
                if running.is_some() || swapping.is_some() {
                    if !dirty {
                        println!("{} {} changed: built once change {change} is done", stamp(), shown.display());
                    }
                    dirty = true;
                } else {
                    if quiet.is_none() {
                        println!("{} {} changed", stamp(), shown.display());
                    }
                    quiet = Some(Box::pin(tokio::time::sleep(DEBOUNCE)));
                }
            }
            () = maybe(quiet.as_mut()) => {
                quiet = None;
                change += 1;
                println!("{} change {change}: building", stamp());
                running = Some(Box::pin(tokio::spawn(pass(project.clone(), next.clone(), cache_dir.clone(), compiler))));
            }
            done = maybe(running.as_mut()) => {
                running = None;
                let passed = match done {
                    Ok(Ok(passed)) => passed,
                    Ok(Err(())) => {
                        println!("{} change {change} failed: {}", stamp(), keeps(&current, &versions));
                        continue;
                    }
                    Err(e) => {
                        println!("{} change {change} stopped: {e}; {}", stamp(), keeps(&current, &versions));
                        continue;
                    }
                };
                if current.as_deref() == Some(passed.version.as_str()) {
                    println!(
                        "{} change {change}: built in {} and {} cases passed in {}; the component is the same, {}",
                        stamp(), millis(passed.build), passed.ran.passed, millis(passed.test), keeps(&current, &versions)
                    );
                    continue;
                }
                let swap_started = Instant::now();
                if let Err(e) = std::fs::rename(&passed.next, &live) {
                    println!("{} cannot swap in {}: {e}; {}", stamp(), live.display(), keeps(&current, &versions));
                    continue;
                }
                if serving.is_none() {
                    match Serving::start(&config, cache_dir.clone(), compiler).await {
                        Ok(started) => serving = Some(started),
                        Err(e) => return Err(e.context("starting the route")),
                    }
                    let number = versions.len() + 1;
                    versions.insert(passed.version.clone(), number);
                    current = Some(passed.version.clone());
                    println!(
                        "{} {} serving: build {}, cases {} ({} passed, compiling {}), start {}.",
                        stamp(), version_of(&versions, &passed.version), millis(passed.build), millis(passed.test),
                        passed.ran.passed, millis(passed.ran.startup), millis(swap_started.elapsed())
                    );
                    if let Some(serving) = &serving {
                        println!(
                            "Type a message and press Enter to send it to {} (`KEY: PAYLOAD` gives it a key).",
                            serving.input
                        );
                    }
                    if feed.is_some() {
                        feed_timer = Some(Box::pin(tokio::time::sleep(Duration::ZERO)));
                    }
                } else {
                    swapping = Some((swap_started, passed));
                    swap_deadline = Some(Box::pin(tokio::time::sleep(SWAP_LIMIT)));
                }
            }
            line = stdin.recv(), if stdin_open => match line {
                None => stdin_open = false,
                Some(line) if line.trim().is_empty() => {}
                Some(line) => match &serving {
                    None => println!("{} not sent: nothing serves yet", stamp()),
                    Some(serving) => {
                        sent += 1;
                        let id = format!("dev-{sent}");
                        match serving.send(&id, &line).await {
                            Ok(()) => println!("{} sent {id} to {}", stamp(), serving.input),
                            Err(e) => println!("{} {e:#}", stamp()),
                        }
                    }
                },
            },
            // A reload that did not report in time (its event lost to a
            // slow reader): the route says what it serves.
            () = maybe(swap_deadline.as_mut()) => {
                swap_deadline = None;
                if let (Some((_, passed)), Some(serving)) = (swapping.take(), &serving) {
                    let now = serving.hopper.status().first().map(|s| s.version.clone());
                    if now.as_deref() == Some(passed.version.as_str()) {
                        let number = versions.len() + 1;
                        versions.entry(passed.version.clone()).or_insert(number);
                        current = Some(passed.version.clone());
                        println!("{} {} serving (swapped in unreported)", stamp(), version_of(&versions, &passed.version));
                    } else {
                        println!(
                            "{} the route did not swap in {} within {}; {}",
                            stamp(), version_of(&versions, &passed.version), humantime::format_duration(SWAP_LIMIT), keeps(&current, &versions)
                        );
                    }
                }
            }
            () = maybe(feed_timer.as_mut()) => {
                feed_timer = None;
                if let (Some(lines), Some(serving)) = (&feed, &serving) {
                    let line = &lines[fed % lines.len()];
                    fed += 1;
                    sent += 1;
                    let id = format!("dev-{sent}");
                    match serving.send(&id, line).await {
                        Ok(()) => println!("{} sent {id} to {} (message {fed} of {})", stamp(), serving.input, lines.len() * rounds),
                        Err(e) => println!("{} {e:#}", stamp()),
                    }
                    if fed < lines.len() * rounds {
                        feed_timer = Some(Box::pin(tokio::time::sleep(interval)));
                    } else {
                        feed = None;
                    }
                }
            }
            event = async { match serving.as_mut() { Some(s) => s.events.recv().await, None => std::future::pending().await } } => match event {
                Ok(Event::Handled(events::Handled { id, attempt, verdict, version, .. })) => {
                    println!("{} {id} attempt {attempt}: {verdict}, by {}", stamp(), version_of(&versions, &version));
                }
                Ok(Event::Hop(hop::Outcome::Retry(hop::Retry { id, topic, delay, .. }))) => {
                    println!("{} {id} → {topic} (due in {})", stamp(), humantime::format_duration(delay));
                }
                Ok(Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, reason, .. }))) => {
                    println!("{} {id} dead-lettered ({reason})", stamp());
                }
                Ok(Event::HandlerReloaded(events::HandlerReloaded { new_version, .. })) => {
                    if let Some((swap_started, passed)) = swapping.take() {
                        swap_deadline = None;
                        let number = versions.len() + 1;
                        versions.entry(new_version.clone()).or_insert(number);
                        current = Some(new_version.clone());
                        println!(
                            "{} {} serving: build {}, cases {} ({} passed, compiling {}), swap {}.",
                            stamp(), version_of(&versions, &new_version), millis(passed.build), millis(passed.test),
                            passed.ran.passed, millis(passed.ran.startup), millis(swap_started.elapsed())
                        );
                    }
                }
                Ok(Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. })) => {
                    swapping = None;
                    swap_deadline = None;
                    println!("{} the new version did not load: {error}; {}", stamp(), keeps(&current, &versions));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    println!("{} the route stopped: stopping", stamp());
                    break;
                }
                _ => {}
            },
        }
    }
    if let Some(running) = running.take() {
        running.abort();
        let _ = running.await;
    }
    if let Some(Serving {
        hopper,
        _broker: broker,
        producer,
        ..
    }) = serving
    {
        hopper.stop().await;
        drop(producer);
        // The delay relay's clients finish closing in the background after
        // `stop` returns: the broker ends with the process, a moment later,
        // so that they do not log its loss as an error.
        std::mem::forget(broker);
    }
    println!("{} stopped", stamp());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_word_before_a_colon_and_json_is_all_payload() {
        assert_eq!(parse_message("k-1: hello"), (Some("k-1"), "hello"));
        assert_eq!(parse_message("hello"), (None, "hello"));
        assert_eq!(parse_message(r#"{"a": 1}"#), (None, r#"{"a": 1}"#));
        assert_eq!(parse_message("two words: x"), (None, "two words: x"));
    }

    #[test]
    fn build_output_and_editor_files_are_not_sources() {
        let project = Project {
            dir: "/p".into(),
            wasm: "/p/h.wasm".into(),
            name: "h".into(),
            build: "/p/build.sh".into(),
            cases: "/p/cases.toml".into(),
        };
        for source in [
            "/p/app.py",
            "/p/src/lib.rs",
            "/p/cases.toml",
            "/p/wit/handler.wit",
        ] {
            assert!(project.is_source(Path::new(source)), "{source}");
        }
        for output in [
            "/p/h.wasm",
            "/p/target/release/x.rlib",
            "/p/build/core.wasm",
            "/p/build/handler.c",
            "/p/.app.py.swp",
            "/p/app.py~",
            "/p/Cargo.lock",
            "/p/__pycache__/app.cpython.pyc",
            "/p/__pycache__",
            "/p/build",
            "/elsewhere/app.py",
        ] {
            assert!(!project.is_source(Path::new(output)), "{output}");
        }
    }

    #[test]
    fn the_served_config_is_the_cases_files_route_on_the_embedded_broker() {
        let dir = tempfile::tempdir().unwrap();
        let cases = dir.path().join("cases.toml");
        std::fs::write(
            &cases,
            include_str!("../../../templates/cases.toml").replace("{{name}}", "h"),
        )
        .unwrap();
        let live = dir.path().join("live/h.wasm");
        std::fs::create_dir(dir.path().join("live")).unwrap();
        std::fs::write(&live, b"").unwrap();
        let config = dir.path().join("hopper.toml");
        std::fs::write(&config, config_text(&cases, &live).unwrap()).unwrap();
        let config = hopper::config::Config::load(&config).unwrap();
        assert!(config.kafka.embedded);
        assert!(config.delay.is_some());
        let [route] = config.routes.as_slice() else {
            panic!("{:?}", config.routes)
        };
        assert_eq!(route.name, "dev");
        assert_eq!(route.topics, ["dev.in"]);
        assert_eq!(route.handler, live);
        assert_eq!(route.timeout, Duration::from_secs(5));

        std::fs::write(dir.path().join("bad.toml"), "route = 1\n").unwrap();
        let error = config_text(&dir.path().join("bad.toml"), &live)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[route] is not a table"), "{error}");
    }

    #[test]
    fn a_messages_file_without_a_message_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("messages.txt");
        std::fs::write(&file, "# only a comment\n\n").unwrap();
        let error = read_messages(&file).unwrap_err().to_string();
        assert!(error.contains("has no message"), "{error}");
        std::fs::write(&file, "# two\nk: a\nb\n").unwrap();
        assert_eq!(read_messages(&file).unwrap(), ["k: a", "b"]);
        let error = read_messages(&dir.path().join("none.txt"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot read messages file"), "{error}");
    }

    #[test]
    fn a_directory_without_a_project_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let error = Project::find(dir.path()).err().unwrap().to_string();
        assert!(error.contains("it has no build.sh"), "{error}");
        std::fs::write(dir.path().join("build.sh"), "").unwrap();
        std::fs::write(dir.path().join("cases.toml"), "").unwrap();
        std::fs::write(dir.path().join("test.sh"), "echo\n").unwrap();
        let error = Project::find(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains("does not name the component it tests"),
            "{error}"
        );
        std::fs::write(
            dir.path().join("test.sh"),
            "# plugin test x.wasm\n\"$H\" plugin test greeter.wasm cases.toml \"$@\"\n",
        )
        .unwrap();
        let project = Project::find(dir.path()).unwrap();
        assert_eq!(project.name, "greeter");
        assert_eq!(project.wasm, dir.path().join("greeter.wasm"));
    }
}
