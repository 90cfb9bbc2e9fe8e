//! The `hopper` command: a thin layer over the library.

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use hopper::config::{Config, OwnedKind};
use hopper::embedded::EmbeddedBroker;
use hopper::kafka::Cluster;
use hopper::{Hopper, Options, Stopped};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod capture;
mod config_check;
mod demo;
mod dev;
mod dlq_replay;
mod dlq_try;
mod ops;
mod parked;
mod scaffold;
mod session;
mod test_cases;
mod topics;

#[global_allocator]
static ALLOCATOR: hopper::Allocator = hopper::Allocator;

#[derive(Parser)]
#[command(
    name = "hopper",
    version,
    about = "Delay, retry and dead-letter plumbing for Kafka, around WebAssembly handlers."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where compiled handlers are cached, keyed by the sha256 of the
    /// `.wasm`. Default: `$XDG_CACHE_HOME/hopper/components`, else
    /// `~/.cache/hopper/components`.
    #[arg(long, global = true, env = "HOPPER_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every handler at startup and on reload; cache nothing.
    #[arg(long, global = true, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// What compiles handlers: `cranelift` optimises (the default, for
    /// production); `winch` compiles a Python or JavaScript handler about
    /// six times faster into slower code (the default of `hopper dev`).
    #[arg(long, global = true, env = "HOPPER_COMPILER", value_name = "COMPILER")]
    compiler: Option<hopper::plugin::Compiler>,
    /// Log lines as text, or as one JSON object per line (for log
    /// shippers). Text has colour only when stderr is a terminal.
    #[arg(long, global = true, env = "HOPPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the routes of a config file until SIGTERM or Ctrl-C, then
    /// drains: exit 0 once every call finished, every hop was acknowledged
    /// and the offsets were committed; non-zero when the deadline came first,
    /// a route failed, or a second signal forced the exit.
    Run {
        /// The config file.
        #[arg(short, long, default_value = "hopper.toml")]
        config: PathBuf,
        /// Bootstrap servers; overrides `kafka.brokers`.
        #[arg(long, env = "HOPPER_BROKERS")]
        brokers: Option<String>,
        /// Run on an embedded in-memory broker on 127.0.0.1 (trials only:
        /// it keeps nothing).
        #[arg(long, conflicts_with = "brokers")]
        embedded: bool,
        /// How long the drain after SIGTERM or Ctrl-C may take (humantime:
        /// 30s, 2m). What is not done by then is re-delivered after a
        /// restart. At most 24h.
        #[arg(long, env = "HOPPER_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = shutdown_timeout)]
        shutdown_timeout: std::time::Duration,
    },
    /// Runs the order-timeout demo on the embedded broker: sample orders
    /// that succeed, retry, and land in the dead-letter topic.
    Demo {
        /// A config file to run instead of the demo's own, which travels
        /// inside the binary with its handlers (host/demo/ in the source):
        /// its routes, handlers and order service.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Keep running after the sample orders settle, until Ctrl-C.
        #[arg(long)]
        linger: bool,
        /// Use this handler component instead of the config's `handler`.
        #[arg(long)]
        handler: Option<PathBuf>,
        /// Print hopper's log lines (the handlers' own logs, warnings) among
        /// the live view. Without it only hopper's errors are logged.
        #[arg(long)]
        logs: bool,
    },
    /// The handler development loop, in a project made by `hopper plugin
    /// new`: serves the handler on the embedded broker, and on each change
    /// to its sources runs build.sh, then the cases of cases.toml, and
    /// swaps the new version in only when both pass. Messages typed on
    /// stdin (one a line, `KEY: PAYLOAD` or a payload) are sent to the
    /// route.
    Dev(dev::DevArgs),
    /// Sends a message to be delivered to a topic later, through the delay
    /// relay's inbox. The payload is read from stdin unless --payload is given.
    Send(SendArgs),
    /// Handler components.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Dead-letter topics: list, show and replay records, and try a
    /// candidate handler on them, straight against the brokers (no running
    /// hopper needed).
    Dlq {
        #[command(subcommand)]
        command: ops::DlqCommand,
    },
    /// Delayed messages: cancel one by id, or show its pending
    /// cancellation, straight against the brokers.
    Delay {
        #[command(subcommand)]
        command: ops::DelayCommand,
    },
    /// Keys parked by ordered retries (`retry_order = "key"`): list them,
    /// release one, or purge one's records, straight against the brokers.
    Parked {
        #[command(subcommand)]
        command: parked::ParkedCommand,
    },
    /// What waits in each topic of each route, the size of each dead-letter
    /// topic, and, when hopper's admin server answers, readiness and handler
    /// versions.
    Status(ops::Target),
    /// Gets a partition past a batch its consumer cannot decode (corrupt,
    /// or compressed with a codec this build lacks): records the skipped
    /// offsets in the dead-letter topic (reason UNDECODABLE) and commits
    /// the first readable offset. Every hopper of the pipeline must be
    /// stopped first.
    Skip(ops::SkipArgs),
    /// Every topic a config reads, writes or creates, with what it is and
    /// the settings hopper creates it with. Needs no broker.
    Topics(topics::TopicsArgs),
    /// The Kafka ACLs a config needs, for `hopper run` or (`--for cli`) the
    /// CLI, as a `kafka-acls.sh` script or JSON. Needs no broker.
    Acls(topics::AclsArgs),
    /// Config files: check one as `hopper run` would at start, with no
    /// broker.
    Config {
        #[command(subcommand)]
        command: config_check::ConfigCommand,
    },
    /// Prints the completion script for SHELL to stdout; for instance
    /// `hopper completions bash > ~/.local/share/bash-completion/completions/hopper`,
    /// `hopper completions zsh > ~/.zfunc/_hopper`, or `hopper completions
    /// fish > ~/.config/fish/completions/hopper.fish`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Writes a man page for hopper and one for each of its subcommands
    /// (hopper.1, hopper-run.1, hopper-dlq-ls.1, ...) into DIR: what `cargo
    /// xtask dist` ships.
    #[command(hide = true)]
    Manpages {
        /// The directory to write them into; created if missing.
        dir: PathBuf,
    },
}

#[derive(Args)]
struct SendArgs {
    /// The topic the message is delivered to.
    #[arg(long)]
    topic: String,
    /// How long to wait (humantime: 90s, 30m, 2d).
    #[arg(long, conflicts_with = "at", required_unless_present = "at")]
    delay: Option<humantime::Duration>,
    /// When to deliver: RFC 3339 (2026-12-01T09:00:00Z) or epoch ms.
    #[arg(long)]
    at: Option<String>,
    /// The message key, delivered with the message. Default: the --id, so
    /// that `hopper delay cancel --id` can reach the schedule (a cancel
    /// reaches only schedules keyed by their id); none without an --id.
    #[arg(long)]
    key: Option<String>,
    /// A header to deliver with the message, `name=value`; repeatable.
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Message id (`hopper-id`); by default derived from the inbox offset.
    #[arg(long)]
    id: Option<String>,
    /// The message payload, as text; read from stdin when not given.
    #[arg(long)]
    payload: Option<String>,
    /// A config file whose `[kafka]` table (brokers, TLS, SASL) and
    /// `[delay]` inbox to use.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Bootstrap servers; overrides the config's `kafka.brokers`. Required
    /// without --config.
    #[arg(long, env = "HOPPER_BROKERS", required_unless_present = "config")]
    brokers: Option<String>,
    /// The delay relay's inbox topic. Default: the config's `[delay]`
    /// inbox, else `hopper.delay`.
    #[arg(long)]
    inbox: Option<String>,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Says whether a file is a component that fits the handler world, and
    /// lists what it imports and exports, and what is missing or extra.
    Check {
        /// The component to check (a `.wasm` file).
        file: PathBuf,
    },
    /// Creates a handler project with a copy of the WIT and a one-command
    /// build (`./build.sh`).
    New {
        /// The language of the handler.
        #[arg(long, value_enum)]
        lang: scaffold::Lang,
        /// The handler's name; the component is built as NAME.wasm.
        name: String,
        /// Where to create the project. Default: ./NAME.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Runs a handler on a cases file (messages, canned HTTP answers,
    /// secrets and what should happen) with no broker, in the sandbox and
    /// grants of `hopper run`. Exits 1 when a case fails.
    Test(test_cases::TestArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    hopper::tune_allocator();
    // Built once, for the life of the process (clap takes a `&'static str`).
    let long_version: &'static str = Box::leak(long_version().into_boxed_str());
    let cli = Cli::command().long_version(long_version).get_matches();
    let cli = Cli::from_arg_matches(&cli).unwrap_or_else(|e| e.exit());
    // The demo prints its own live view; log lines, the handlers' included,
    // only when asked for, and errors.
    let default_filter = match cli.command {
        Command::Demo { logs: true, .. } | Command::Dev(_) => "warn,hopper::plugin=info",
        // The handlers' own lines go through hopper::plugin::state.
        Command::Demo { logs: false, .. } => "error,hopper::plugin::state=off",
        // One line per case, with the handler's warnings and errors under
        // it; its info lines only when asked for.
        Command::Plugin {
            command: PluginCommand::Test(ref args),
        } if args.logs => "warn,hopper::plugin=info",
        Command::Plugin {
            command: PluginCommand::Test(_),
        } => "warn",
        _ => "info",
    };
    init_logs(cli.log_format, default_filter);
    let cache_dir = if cli.no_cache {
        None
    } else {
        cli.cache_dir.or_else(default_cache_dir)
    };
    let result = match cli.command {
        Command::Run {
            config,
            brokers,
            shutdown_timeout,
            embedded,
        } => {
            let options = Options {
                cache_dir,
                shutdown_timeout,
                compiler: cli.compiler.unwrap_or_default(),
            };
            match run(config, brokers, embedded, options).await {
                Ok(code) => return code,
                Err(e) => Err(e),
            }
        }
        Command::Demo {
            config,
            linger,
            handler,
            logs: _,
        } => demo::run(config, linger, handler, cache_dir).await,
        Command::Dev(args) => {
            hopper::without_huge_pages();
            let compiler = cli.compiler.unwrap_or(hopper::plugin::Compiler::Winch);
            dev::run(args, cache_dir, compiler).await
        }
        Command::Completions { shell } => {
            let mut cli = Cli::command().long_version(long_version);
            clap_complete::generate(shell, &mut cli, "hopper", &mut std::io::stdout());
            Ok(())
        }
        Command::Manpages { dir } => manpages(&dir, long_version),
        Command::Plugin {
            command: PluginCommand::Check { file },
        } => plugin_check(file),
        Command::Plugin {
            command: PluginCommand::New { lang, name, dir },
        } => plugin_new(lang, name, dir),
        Command::Plugin {
            command: PluginCommand::Test(args),
        } => {
            hopper::without_huge_pages();
            match test_cases::run(args, cache_dir, cli.compiler.unwrap_or_default()).await {
                Ok(code) => return code,
                Err(e) => Err(e),
            }
        }
        Command::Send(args) => send(args).await,
        Command::Dlq { command } => ops::dlq(command, cache_dir).await,
        Command::Delay { command } => ops::delay(command).await,
        Command::Parked { command } => parked::run(command).await,
        Command::Status(target) => ops::status(target).await,
        Command::Skip(args) => ops::skip(args).await,
        Command::Topics(args) => topics::topics(args),
        Command::Acls(args) => topics::acls(args),
        Command::Config { command } => config_check::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// What `hopper --version` prints: the version and commit, the handler
/// WIT it accepts, and the wasmtime and librdkafka it was built with.
/// Writes the man pages of every command that `--help` lists into `dir`.
fn manpages(dir: &Path, long_version: &'static str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cli = Cli::command().long_version(long_version);
    clap_mangen::generate_to(cli, dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))
}

fn long_version() -> String {
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let world = hopper::plugin::WORLD;
    format!(
        "{} (commit {})\nhandler WIT: {world} (components built against hopper:handler@0.1.0 or later 0.1.x run unchanged)\nwasmtime {}\nlibrdkafka {librdkafka} (TLS, SASL PLAIN/SCRAM/OAUTHBEARER, gzip, snappy, lz4, zstd)",
        env!("CARGO_PKG_VERSION"),
        env!("HOPPER_COMMIT"),
        env!("HOPPER_WASMTIME"),
    )
}

/// Logs to stderr: text (coloured only on a terminal, so files and pipes
/// get no escape codes) or JSON lines whose fields (route, id, attempt,
/// version, ...) sit at the top level of each object. In both, a field's
/// control characters are escaped, so no text from outside can start a
/// line or move the cursor (`hopper::trace::logs`).
fn init_logs(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOPPER_LOG")
        .unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(capture::Stderr);
    match format {
        LogFormat::Text => logs
            .fmt_fields(hopper::trace::logs::EscapedFields)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => {
            let format = tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false);
            // Lines logged during a handler call get its trace id and span.
            logs.json()
                .event_format(hopper::trace::logs::WithTrace(format))
                .init()
        }
    }
}

/// Parses `--shutdown-timeout`: a humantime duration, refused by clap with
/// its bound when it is longer than [`hopper::MAX_SHUTDOWN_TIMEOUT`].
fn shutdown_timeout(text: &str) -> Result<std::time::Duration, String> {
    let timeout: std::time::Duration = text
        .parse::<humantime::Duration>()
        .map_err(|e| e.to_string())?
        .into();
    let options = Options {
        shutdown_timeout: timeout,
        ..Default::default()
    };
    options.validate().map_err(|e| e.to_string())?;
    Ok(timeout)
}

/// `$XDG_CACHE_HOME/hopper/components`, else `~/.cache/hopper/components`.
fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("hopper/components"))
}

/// Loads the config and, when it is asked for, starts the embedded broker.
/// The broker must outlive hopper, so it is returned to the caller.
pub(crate) fn prepare(
    path: &Path,
    brokers: Option<String>,
    embedded: bool,
) -> anyhow::Result<(Config, Option<EmbeddedBroker>)> {
    let mut config = Config::load(path)?;
    if let Some(brokers) = brokers {
        config.kafka.brokers = Some(brokers);
    }
    let broker = EmbeddedBroker::when_asked(&mut config, embedded)?;
    if let Some(broker) = &broker {
        let address = broker.bootstrap_servers();
        println!("Embedded broker listening on {address} (bootstrap.servers={address}).");
    }
    Ok((config, broker))
}

async fn run(
    path: PathBuf,
    brokers: Option<String>,
    embedded: bool,
    options: Options,
) -> anyhow::Result<ExitCode> {
    let (config, _embedded) =
        prepare(&path, brokers, embedded).with_context(|| format!("loading {}", path.display()))?;
    let deadline = options.shutdown_timeout;
    let configured = config.admin.as_ref().is_some_and(|a| a.token.is_some());
    let hopper = Hopper::start(config, options).await?;
    let _session = announce_console(&hopper, configured);
    // The first signal starts the drain; a second one forces the exit.
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let signals = async move {
        let mut signals = Signals::new()?;
        let first = signals.next().await;
        tracing::info!(
            signal = first.name,
            deadline = %humantime::format_duration(deadline),
            "Stopping: finishing the calls in flight and committing (send the signal again to exit at once)."
        );
        let _ = first_tx.send(());
        anyhow::Ok(signals.next().await)
    };
    let stopping = hopper.run_until(async {
        let _ = first_rx.await;
    });
    tokio::select! {
        stopped = stopping => Ok(match stopped {
            Stopped::Cleanly => ExitCode::SUCCESS,
            Stopped::Incomplete(why) => {
                eprintln!("error: stopped before draining: {why}");
                ExitCode::FAILURE
            }
            Stopped::Failed(why) => {
                eprintln!("error: {why}");
                ExitCode::FAILURE
            }
        }),
        second = signals => {
            let second = second?;
            eprintln!(
                "error: {} again: exiting without draining; what was not committed is re-delivered",
                second.name
            );
            Ok(ExitCode::from(128 + second.number))
        }
    }
}

/// Logs the console's address, and writes the session's read token for
/// `hopper status` ([`session`]); the file is removed when the returned
/// guard drops. Without a configured admin token, the URL carries the
/// session token in its fragment (which a browser never sends); with one,
/// the console asks for that token, and the log holds no token at all.
fn announce_console(hopper: &Hopper, configured: bool) -> Option<session::Written> {
    let console = open_console(hopper, configured)?;
    let url = &console.url;
    let reads = if configured {
        "API reads need admin.token, or this session's read token in the file."
    } else {
        "No admin.token is configured: API reads need this session's token, in the URL and the file."
    };
    match console.token_file {
        Ok(file) => {
            tracing::info!(
                console = %url,
                token_file = %file.0.display(),
                "Admin console ready. {reads}"
            );
            Some(file)
        }
        Err(e) => {
            let error = format!("{e:#}");
            tracing::warn!(
                console = %url,
                %error,
                "Admin console ready. The session's read token could not be written for `hopper status`."
            );
            None
        }
    }
}

/// The admin console of a started hopper, when it runs one.
pub(crate) struct Console {
    /// Where a browser opens it: with this session's read token in the
    /// fragment when no `admin.token` is configured.
    pub(crate) url: String,
    /// The session's read token, written for `hopper status`; removed when
    /// dropped.
    pub(crate) token_file: anyhow::Result<session::Written>,
}

/// The console's address, with the session token written for `hopper
/// status`; `None` when hopper runs no admin server.
pub(crate) fn open_console(hopper: &Hopper, configured: bool) -> Option<Console> {
    let addr = hopper.admin_addr()?;
    let token = hopper.admin_session_token()?;
    let url = if configured {
        format!("http://{addr}/")
    } else {
        format!("http://{addr}/#token={token}")
    };
    let token_file = session::write(addr, token).map(session::Written);
    Some(Console { url, token_file })
}

/// A signal that stops hopper.
pub(crate) struct Signal {
    pub(crate) name: &'static str,
    number: u8,
}

/// SIGTERM (systemd, Kubernetes, docker) and SIGINT (Ctrl-C).
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        })
    }

    pub(crate) async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal { name: "SIGTERM", number: 15 },
            _ = self.int.recv() => Signal { name: "SIGINT", number: 2 },
        }
    }
}

pub(crate) async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn plugin_check(file: PathBuf) -> anyhow::Result<()> {
    let runtime = hopper::plugin::Runtime::new(64 << 20)?;
    let fit = runtime.fit(&file)?;
    print!("{fit}");
    if !fit.fits() {
        anyhow::bail!("{} does not fit the handler world", file.display());
    }
    Ok(())
}

fn plugin_new(lang: scaffold::Lang, name: String, dir: Option<PathBuf>) -> anyhow::Result<()> {
    let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
    let written = scaffold::new(lang, &name, &dir)?;
    for file in &written {
        println!("  created {}", file.display());
    }
    println!(
        "Build it with `{}/build.sh`, then test it with `{}/test.sh` (`hopper plugin test {name}.wasm cases.toml`).",
        dir.display(),
        dir.display()
    );
    Ok(())
}

async fn send(args: SendArgs) -> anyhow::Result<()> {
    let deliver_at = args
        .at
        .map(|at| hopper::delay::parse_instant(&at).map_err(|e| anyhow::anyhow!("--at: {e}")))
        .transpose()?;
    let headers = args
        .headers
        .iter()
        .map(|h| {
            h.split_once('=')
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .with_context(|| format!("--header `{h}` is not name=value"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let payload = match args.payload {
        Some(p) => p.into_bytes(),
        None => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).context("reading stdin")?;
            buf
        }
    };
    // Keyed by its id unless told otherwise: only such a schedule can be
    // cancelled or replaced.
    let key = args.key.or_else(|| args.id.clone());
    let message = hopper::delay::DelayedMessage {
        target: args.topic.clone(),
        deliver_at,
        delay: args.delay.map(Into::into),
        id: args.id,
        key: key.map(String::into_bytes),
        payload: Some(payload),
        headers,
    };
    let (mut kafka, mut inbox) = (hopper::config::KafkaConfig::default(), None);
    if let Some(path) = &args.config {
        let config = Config::load(path).with_context(|| format!("loading {}", path.display()))?;
        // With the config come its credentials, often hopper's own: the
        // record goes only to the relay's inbox, for a target the relay
        // would forward to.
        let owned = config.owned();
        if let Some(why) = args
            .inbox
            .as_deref()
            .filter(|i| {
                owned
                    .get(i)
                    .is_some_and(|o| o.kind != OwnedKind::DelayInbox)
            })
            .and_then(|i| owned.refusal(i))
        {
            anyhow::bail!("--inbox: {why}; a schedule goes to the delay relay's inbox");
        }
        match &config.delay {
            Some(relay) => relay.check_target(&args.topic),
            None => owned.refusal(&args.topic).map_or(Ok(()), |why| {
                Err(format!("{why}: a delayed message cannot target it"))
            }),
        }
        .map_err(|why| anyhow::anyhow!("--topic: {why}"))?;
        inbox = config.delay.map(|d| d.inbox);
        kafka = config.kafka;
    }
    if let Some(brokers) = args.brokers {
        kafka.brokers = Some(brokers);
    }
    let inbox = args
        .inbox
        .or(inbox)
        .unwrap_or_else(|| hopper::config::DelayConfig::DEFAULT_INBOX.to_string());
    let cluster = ops::connected(Cluster::of(&kafka)?)?;
    let (partition, offset) = message.send(&cluster.producer()?, &inbox).await?;
    println!(
        "Scheduled for {} via {inbox}[{partition}]@{offset}.",
        args.topic
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument and subcommand under `command` that has no help
    /// text, by its path (`hopper plugin check <file>`).
    fn without_help(command: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if arg.is_hide_set() || arg.get_help().is_some() || arg.get_long_help().is_some() {
                continue;
            }
            let name = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!("<{}>", arg.get_id()),
            };
            out.push(format!("{path} {name}"));
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                out.push(path.clone());
            }
            without_help(sub, &path, out);
        }
    }

    /// Walks clap's own definitions, so a flag, a positional argument or a
    /// command added without a doc comment is caught wherever it sits.
    #[test]
    fn every_command_flag_and_argument_has_help_text() {
        let mut bare = Vec::new();
        without_help(&Cli::command(), "hopper", &mut bare);
        assert!(
            bare.is_empty(),
            "without help text (write a `///` comment):\n{}",
            bare.join("\n")
        );
    }

    #[test]
    fn an_argument_without_help_text_is_named() {
        let command = clap::Command::new("hopper").subcommand(
            clap::Command::new("plugin").about("Handlers.").subcommand(
                clap::Command::new("check")
                    .about("Checks.")
                    .arg(clap::Arg::new("file"))
                    .arg(clap::Arg::new("quiet").long("quiet").help("Says less.")),
            ),
        );
        let mut bare = Vec::new();
        without_help(&command, "hopper", &mut bare);
        assert_eq!(bare, ["hopper plugin check <file>"]);
    }
}
