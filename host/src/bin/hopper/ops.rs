//! `hopper dlq ls|show|replay` and `hopper status`: the same functions the
//! admin API serves, straight against the brokers. Tables by default,
//! `--json` for scripts.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use hopper::config::Config;
use hopper::dlq::{Dlq, DlqFilter, RecordRef};
use hopper::kafka::Cluster;
use std::path::PathBuf;
use std::time::Duration;

/// Where to find the routes and the brokers.
#[derive(Args)]
pub struct Target {
    /// The config file: its routes, dead-letter topics and brokers.
    #[arg(short, long, default_value = "hopper.toml")]
    config: PathBuf,
    /// Bootstrap servers; overrides `kafka.brokers`.
    #[arg(long, env = "HOPPER_BROKERS")]
    brokers: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl Target {
    pub(crate) fn config_path(&self) -> &std::path::Path {
        &self.config
    }

    pub(crate) fn load(&self) -> anyhow::Result<(Config, Cluster)> {
        let mut config = Config::load(&self.config)
            .with_context(|| format!("loading {}", self.config.display()))?;
        if let Some(brokers) = &self.brokers {
            config.kafka.brokers = Some(brokers.clone());
        }
        let cluster = connected(Cluster::of(&config.kafka)?)?;
        Ok((config, cluster))
    }
}

/// `cluster`, once a broker answered and took the credentials: a command
/// against a cluster it cannot reach fails within seconds, naming why.
pub(crate) fn connected(cluster: Cluster) -> anyhow::Result<Cluster> {
    tokio::task::block_in_place(|| cluster.check_connection())?;
    cluster.watch().checked();
    Ok(cluster)
}

/// Which dead-letter records a command selects.
#[derive(Args, Default)]
pub struct Filter {
    /// Records of this route (`delay`: the delay relay's).
    #[arg(long)]
    pub(crate) route: Option<String>,
    /// The reason class, such as FATAL.
    #[arg(long)]
    reason: Option<String>,
    /// Failed at or after: RFC 3339 or epoch ms.
    #[arg(long)]
    since: Option<String>,
    /// Failed before: RFC 3339 or epoch ms.
    #[arg(long)]
    until: Option<String>,
    /// The record key, exactly.
    #[arg(long)]
    key: Option<String>,
    /// Text in the last error (case-insensitive).
    #[arg(long)]
    text: Option<String>,
    /// The dead letters of one cause: a group id as `hopper dlq groups`
    /// lists it.
    #[arg(long)]
    group: Option<String>,
    /// Only records never replayed (by the replay journal).
    #[arg(long)]
    not_replayed: bool,
}

impl Filter {
    pub(crate) fn resolve(&self) -> anyhow::Result<DlqFilter> {
        let instant = |name: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    hopper::delay::parse_instant(v).map_err(|e| anyhow::anyhow!("--{name}: {e}"))
                })
                .transpose()
        };
        Ok(DlqFilter {
            route: self.route.clone(),
            reason: self.reason.clone(),
            since: instant("since", &self.since)?,
            until: instant("until", &self.until)?,
            key: self.key.clone(),
            text: self.text.clone(),
            group: self.group.clone(),
            not_replayed: self.not_replayed,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.resolve().is_ok_and(|f| f == DlqFilter::default())
    }
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Lists dead-letter records, newest failure first.
    Ls {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        filter: Filter,
        /// Records to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Matches to skip (for the next page).
        #[arg(long, default_value_t = 0)]
        skip: usize,
    },
    /// The dead letters grouped by cause (route, reason class and last
    /// error with its numbers, ids and quoted values taken out), the most
    /// recently failed group first: count, first and last failure, the
    /// handler versions, how many were never replayed, and the newest error.
    /// `--group ID` selects one group in `ls`, `replay` and `try`.
    Groups {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        filter: Filter,
    },
    /// Writes the selected dead letters as JSON lines, one object per
    /// record with its key, payload and every header (text where it is
    /// UTF-8, else base64), in offset order per partition. Reads every
    /// record, with no scan limit, and writes nothing to Kafka. Progress
    /// goes to stderr.
    Export {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        filter: Filter,
        /// Write to this file instead of stdout.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Shows one record: every header, and the payload.
    Show {
        /// The record, as topic:partition:offset (as `ls` prints it).
        #[arg(required_unless_present = "group")]
        record: Option<RecordRef>,
        /// Show the newest record of this group (`hopper dlq groups`)
        /// instead.
        #[arg(long, conflicts_with = "record")]
        group: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Replays records to their route's input (the relay's to its inbox),
    /// at a limited rate. The dead-letter topic is not changed.
    Replay {
        #[command(flatten)]
        target: Target,
        /// A record to replay, topic:partition:offset; repeatable.
        #[arg(long = "record", conflicts_with_all = ["route", "reason", "since", "until", "key", "text", "group", "not_replayed", "all"])]
        records: Vec<RecordRef>,
        #[command(flatten)]
        filter: Filter,
        /// Replay every record of every dead-letter topic of the config.
        #[arg(long)]
        all: bool,
        /// List what would be replayed; produce nothing.
        #[arg(long)]
        dry_run: bool,
        /// Records per second; default `replay.rate` of the config.
        #[arg(long)]
        rate: Option<u32>,
        /// Resume replay run RUN, as a replay prints it, with the same
        /// selection: skip each record it replayed.
        #[arg(long, value_name = "RUN")]
        resume: Option<hopper::dlq::run::RunId>,
    },
    /// Calls a candidate handler on the selected records of one route, in
    /// the sandbox, and reports what it would do with each: succeed, retry
    /// or be dead-lettered again, and why. Writes nothing to any topic.
    Try(crate::dlq_try::TryArgs),
}

pub async fn dlq(command: DlqCommand, cache_dir: Option<PathBuf>) -> anyhow::Result<()> {
    match command {
        DlqCommand::Ls {
            target,
            filter,
            limit,
            skip,
        } => {
            let (config, cluster) = target.load()?;
            let filter = filter.resolve()?;
            let page = blocking(move || {
                Dlq {
                    cluster: &cluster,
                    config: &config,
                }
                .list(&filter, skip, limit)
            })
            .await?;
            if target.json {
                println!("{}", serde_json::to_string_pretty(&page)?);
                return Ok(());
            }
            let rows = page
                .records
                .iter()
                .map(|r| {
                    vec![
                        r.at.to_string(),
                        r.failed_at.map(iso).unwrap_or_default(),
                        r.route.clone().unwrap_or_default(),
                        r.reason.map(|r| r.to_string()).unwrap_or_default(),
                        r.id.clone().unwrap_or_default(),
                        r.key.clone().unwrap_or_default(),
                        r.replayed.to_string(),
                        r.error.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            let headers = [
                "RECORD",
                "FAILED AT",
                "ROUTE",
                "REASON",
                "ID",
                "KEY",
                "REPLAYED",
                "ERROR",
            ];
            print!("{}", table(&headers, rows));
            println!(
                "{} matching of {} read from {}{}; showing {} from {}.",
                page.total,
                page.scanned,
                page.topics.join(", "),
                if page.truncated {
                    " (stopped at the scan limit)"
                } else {
                    ""
                },
                page.records.len(),
                page.skip
            );
            Ok(())
        }
        DlqCommand::Groups { target, filter } => {
            let (config, cluster) = target.load()?;
            let filter = filter.resolve()?;
            let page = blocking(move || {
                Dlq {
                    cluster: &cluster,
                    config: &config,
                }
                .groups(&filter)
            })
            .await?;
            if target.json {
                println!("{}", serde_json::to_string_pretty(&page)?);
                return Ok(());
            }
            let rows = page
                .groups
                .iter()
                .map(|g| {
                    vec![
                        g.group.clone(),
                        g.count.to_string(),
                        g.not_replayed.map(|n| n.to_string()).unwrap_or_default(),
                        g.first_failed_at.map(iso).unwrap_or_default(),
                        g.last_failed_at.map(iso).unwrap_or_default(),
                        g.route.clone().unwrap_or_default(),
                        g.reason.map(|r| r.to_string()).unwrap_or_default(),
                        g.versions.iter().cloned().collect::<Vec<_>>().join(","),
                        g.sample.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            let headers = [
                "GROUP",
                "COUNT",
                "NOT REPLAYED",
                "FIRST FAILED",
                "LAST FAILED",
                "ROUTE",
                "REASON",
                "VERSIONS",
                "NEWEST ERROR",
            ];
            print!("{}", table(&headers, rows));
            println!(
                "{} group(s) of {} matching of {} read from {}{}.",
                page.groups.len(),
                page.total,
                page.scanned,
                page.topics.join(", "),
                if page.other > 0 {
                    format!("; {} more in no group past the cap", page.other)
                } else {
                    String::new()
                }
            );
            Ok(())
        }
        DlqCommand::Export {
            target,
            filter,
            out,
        } => export(target, filter, out).await,
        DlqCommand::Show {
            record,
            group,
            target,
        } => {
            let (config, cluster) = target.load()?;
            let shown = blocking(move || {
                let dlq = Dlq {
                    cluster: &cluster,
                    config: &config,
                };
                let record = match (record, group) {
                    (Some(record), _) => record,
                    (None, group) => {
                        let filter = DlqFilter {
                            group: group.clone(),
                            ..DlqFilter::default()
                        };
                        let page = dlq.groups(&filter)?;
                        match page.groups.into_iter().next() {
                            Some(g) => g.sample_record,
                            None => {
                                return Err(anyhow::anyhow!(
                                    "no dead letter of group `{}` in {}",
                                    group.unwrap_or_default(),
                                    page.topics.join(", ")
                                ));
                            }
                        }
                    }
                };
                Ok(dlq.show(&record)?)
            })
            .await?;
            if target.json {
                println!("{}", serde_json::to_string_pretty(&shown)?);
                return Ok(());
            }
            let s = &shown.summary;
            let mut rows: Vec<Vec<String>> = vec![
                vec!["record".into(), s.at.to_string()],
                vec!["timestamp".into(), s.timestamp.map(iso).unwrap_or_default()],
                vec!["replayed".into(), s.replayed.to_string()],
                vec![
                    "trace".into(),
                    shown.trace_id.clone().unwrap_or_else(|| "(none)".into()),
                ],
            ];
            for h in &shown.headers {
                let value = match &h.value {
                    None => "(null)".to_string(),
                    Some(v) => v.text.clone().unwrap_or_else(|| format!("hex {}", v.hex)),
                };
                rows.push(vec![h.name.clone(), value]);
            }
            if let Some(key) = &shown.key {
                rows.push(vec![
                    "key".into(),
                    key.text
                        .clone()
                        .unwrap_or_else(|| format!("hex {}", key.hex)),
                ]);
            }
            print!("{}", table(&["FIELD", "VALUE"], rows));
            // In full, where the table would cut it: to be opened.
            if let Some(url) = &shown.trace_url {
                println!("trace link: {}", clean(url));
            }
            match &shown.payload {
                None => println!("payload: (none)"),
                Some(p) => match &p.text {
                    Some(text) => println!("payload ({} bytes):\n{}", p.len, clean(text)),
                    None => println!("payload ({} bytes, not UTF-8), hex:\n{}", p.len, p.hex),
                },
            }
            Ok(())
        }
        DlqCommand::Replay {
            target,
            records,
            filter,
            all,
            dry_run,
            rate,
            resume,
        } => {
            crate::dlq_replay::run(crate::dlq_replay::Replay {
                target,
                records,
                filter,
                all,
                dry_run,
                rate,
                resume,
            })
            .await
        }
        DlqCommand::Try(args) => crate::dlq_try::run(args, cache_dir).await,
    }
}

/// `hopper status`: per pipeline, what waits in each topic (from the
/// brokers) and the size of its DLQ; and, when the config's admin server
/// answers, readiness and handler versions.
pub async fn status(target: Target) -> anyhow::Result<()> {
    let (config, cluster) = target.load()?;
    let watched = hopper::lag::watched(&config);
    let (config2, cluster2) = (config.clone(), cluster.clone());
    let (pending, dlqs) = blocking(move || -> anyhow::Result<_> {
        let pending = hopper::lag::Sampler::default().pending(&cluster2, &watched)?;
        let mut dlqs = Vec::new();
        for topic in config2.dead_letter_topics() {
            let size = hopper::lag::topic_size(&cluster2, &topic)?;
            dlqs.push((topic, size));
        }
        Ok((pending, dlqs))
    })
    .await?;
    let live = match &config.admin {
        Some(admin) => {
            // Only the session's read token `hopper run` wrote for this
            // address: never the configured token, which changes state, to
            // whatever listens on the address (hopper may be down, and
            // another local user's listener in its place).
            Some(match crate::session::read(admin.listen) {
                Ok(token) => live_status(admin.listen, token.as_deref()).await,
                Err(refused) => Err(refused),
            })
        }
        None => None,
    };
    if target.json {
        let dlqs: Vec<_> = dlqs
            .iter()
            .map(|(topic, records)| serde_json::json!({ "topic": topic, "records": records }))
            .collect();
        let live = live.map(|l| l.unwrap_or_else(|e| serde_json::json!({ "error": e })));
        let out =
            serde_json::json!({ "pending": pending, "dead_letter_topics": dlqs, "live": live });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let rows = pending
        .iter()
        .map(|p| {
            vec![
                p.pipeline.clone(),
                p.topic.clone(),
                p.kind.to_string(),
                p.messages.to_string(),
            ]
        })
        .collect();
    print!("{}", table(&["PIPELINE", "TOPIC", "KIND", "PENDING"], rows));
    println!();
    let rows = dlqs
        .iter()
        .map(|(t, n)| vec![t.clone(), n.to_string()])
        .collect();
    print!("{}", table(&["DEAD-LETTER TOPIC", "RECORDS"], rows));
    match live {
        None => println!(
            "\nNo [admin] table in the config: readiness and handler versions are not known here."
        ),
        Some(Err(e)) => println!("\nNo status from the admin server: {e}."),
        Some(Ok(live)) => {
            println!("\nready: {}", live["ready"]);
            let rows = live["handlers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    let text = |k: &str| h[k].as_str().unwrap_or("-").to_string();
                    vec![
                        text("route"),
                        text("version").chars().take(12).collect(),
                        text("last_reload_error"),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(&["ROUTE", "VERSION", "LAST RELOAD ERROR"], rows)
            );
            let breakers: Vec<Vec<String>> = live["pipelines"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["breaker"].is_object())
                .map(|p| {
                    let b = &p["breaker"];
                    let number = |k: &str| b[k].as_i64().unwrap_or_default();
                    let (state, detail) = match b["state"].as_str().unwrap_or("-") {
                        "open" => ("open", format!("until {}", iso(number("until_ms")))),
                        "half_open" => (
                            "half-open",
                            format!("{} of {} probes out", number("admitted"), number("probes")),
                        ),
                        other => (other, "-".to_string()),
                    };
                    let name = p["name"].as_str().unwrap_or("-").to_string();
                    vec![name, state.to_string(), detail]
                })
                .collect();
            if !breakers.is_empty() {
                println!();
                print!("{}", table(&["ROUTE", "BREAKER", "DETAIL"], breakers));
            }
            let parked = parked_rows(&live["parked"]);
            if !parked.is_empty() {
                println!();
                print!(
                    "{}",
                    table(
                        &["ROUTE", "PARKED KEYS", "BLOCKED KEYS", "WAITING", "OLDEST"],
                        parked
                    )
                );
            }
        }
    }
    Ok(())
}

/// `GET /api/status` of a running hopper's admin server, with the session's
/// read token: every API read needs one.
async fn live_status(
    addr: std::net::SocketAddr,
    token: Option<&str>,
) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let authorization = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let request = format!("GET /api/status HTTP/1.0\r\nHost: {addr}\r\n{authorization}\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| format!("{addr} did not answer in 3s"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("not an HTTP response")?;
    if head.starts_with("HTTP/1.1 401") || head.starts_with("HTTP/1.0 401") {
        let file = crate::session::path(addr)
            .map_or_else(|| "(no directory)".into(), |p| p.display().to_string());
        return Err(match token {
            Some(_) => {
                format!("the session token in {file} was refused (a file of an earlier run?)")
            }
            None => format!(
                "it needs a token: run this as the user that runs hopper, which writes its session's read token to {file} (the configured admin.token is never sent: it changes state)"
            ),
        });
    }
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    serde_json::from_str(body).map_err(|e| e.to_string())
}

/// Dead letters exported between two progress lines.
const EXPORT_PROGRESS_EVERY: usize = 10_000;

async fn export(target: Target, filter: Filter, out: Option<PathBuf>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let (config, cluster) = target.load()?;
    let filter = filter.resolve()?;
    let sink: Box<dyn std::io::Write + Send> = match &out {
        Some(path) => Box::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let (read, matched, written) = blocking(move || {
        let mut sink = std::io::BufWriter::new(sink);
        let mut failed: Option<std::io::Error> = None;
        let mut written = 0usize;
        let dlq = Dlq {
            cluster: &cluster,
            config: &config,
        };
        let (read, matched) = dlq.for_each_match(&filter, usize::MAX, |summary, message| {
            if failed.is_some() {
                return;
            }
            let line = hopper::dlq::export::Exported::of(&message, summary);
            let result = serde_json::to_writer(&mut sink, &line)
                .map_err(std::io::Error::from)
                .and_then(|()| sink.write_all(b"\n"));
            match result {
                Ok(()) => {
                    written += 1;
                    if written.is_multiple_of(EXPORT_PROGRESS_EVERY) {
                        eprintln!("exported {written} dead letters so far");
                    }
                }
                Err(e) => failed = Some(e),
            }
        })?;
        let flushed = sink.flush();
        match failed.map_or(flushed, Err) {
            // A reader that stopped early (`| head`) is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(anyhow::Error::from(e).context("writing the export")),
            Ok(()) => {}
        }
        anyhow::Ok((read, matched, written))
    })
    .await?;
    eprintln!(
        "exported {written} of {matched} matching dead letters ({read} read){}",
        out.map(|p| format!(" to {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}

pub(crate) async fn blocking<T: Send + 'static, E: Into<anyhow::Error> + Send + 'static>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .context("the broker call panicked")?
        .map_err(Into::into)
}

/// The parked and blocked keys of each route with ordered retries, from
/// `/api/status`'s `parked`: counts, and the oldest key (the listing is
/// oldest first).
fn parked_rows(parked: &serde_json::Value) -> Vec<Vec<String>> {
    parked
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let count = |k: &str| r[k].as_u64().unwrap_or_default().to_string();
            let oldest = match r["keys"].get(0) {
                Some(k) => format!(
                    "key {:?} of {}[{}], {} since {}",
                    k["key"].as_str().unwrap_or_default(),
                    k["topic"].as_str().unwrap_or("-"),
                    k["partition"],
                    k["state"].as_str().unwrap_or("-"),
                    k["since_ms"].as_i64().map_or("-".to_string(), iso)
                ),
                None => "-".to_string(),
            };
            vec![
                r["route"].as_str().unwrap_or("-").to_string(),
                count("parked_keys"),
                count("blocked_keys"),
                count("messages"),
                oldest,
            ]
        })
        .collect()
}

/// `ms` as RFC 3339; a time past year 9999, or before 1970, as its
/// milliseconds (the formatter takes neither).
pub fn iso(ms: i64) -> String {
    /// 9999-12-31T23:59:59.999Z.
    const LAST: i64 = 253_402_300_799_999;
    if !(0..=LAST).contains(&ms) {
        return format!("{ms} ms after the epoch");
    }
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

/// `text` safe to print on a terminal: control characters (escape
/// sequences, carriage returns, newlines) shown as `\u{..}` instead of
/// acted on.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Rows under headers, each column as wide as its widest cell (cut at 60
/// characters); cells cleaned of control characters and newlines.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    const MAX: usize = 60;
    let cell = |text: &str| {
        let text = clean(text).replace('\n', "\\n");
        if text.chars().count() > MAX {
            let cut: String = text.chars().take(MAX - 1).collect();
            format!("{cut}…")
        } else {
            text
        }
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| cell(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[derive(Subcommand)]
pub enum DelayCommand {
    /// Cancels every pending delayed message of an id: produces a cancel
    /// record (key = the id) to the relay's inbox.
    Cancel {
        #[command(flatten)]
        target: Target,
        /// The message id (`hopper-id`).
        #[arg(long)]
        id: String,
    },
    /// Whether an id has a pending cancellation, read from the relay's
    /// cancellation topic.
    Show {
        #[command(flatten)]
        target: Target,
        /// The message id (`hopper-id`).
        #[arg(long)]
        id: String,
    },
}

pub async fn delay(command: DelayCommand) -> anyhow::Result<()> {
    let relay_of = |config: &Config| {
        config.delay.clone().with_context(
            || "the config has no [delay] table: there is no delay relay to cancel through",
        )
    };
    match command {
        DelayCommand::Cancel { target, id } => {
            let (config, cluster) = target.load()?;
            let relay = relay_of(&config)?;
            let (partition, offset) =
                hopper::delay::cancel(&cluster.producer()?, &relay.inbox, &id)
                    .await
                    .with_context(|| format!("cancelling `{id}`"))?;
            if target.json {
                let out = serde_json::json!({
                    "id": id, "inbox": relay.inbox, "partition": partition, "offset": offset,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!(
                    "Cancel of `{id}` sent to {}[{partition}]@{offset}: it covers every schedule of `{id}` read before it.",
                    relay.inbox
                );
            }
        }
        DelayCommand::Show { target, id } => {
            let (config, cluster) = target.load()?;
            let relay = relay_of(&config)?;
            let found =
                hopper::delay::lookup(&cluster, &relay.cancels, relay.cancel_lifetime(), &id)
                    .await
                    .with_context(|| format!("reading `{}`", relay.cancels))?;
            if target.json {
                let out = serde_json::json!({ "id": id, "cancellations": found });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                if found.is_empty() {
                    println!("`{id}`: no pending cancellation.");
                }
                for c in found {
                    println!(
                        "`{id}`: {} read at {}[{}]@{}: schedules of `{id}` keyed by their id and read before it from partition {} are not delivered. Expires at {}.",
                        c.kind,
                        relay.inbox,
                        c.partition,
                        c.offset,
                        c.partition,
                        humantime::format_rfc3339_millis(
                            std::time::UNIX_EPOCH
                                + Duration::from_millis(c.expires_at.max(0) as u64)
                        )
                    );
                }
            }
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct SkipArgs {
    #[command(flatten)]
    target: Target,
    /// The route (or `delay` for the delay relay) whose partition is stuck.
    #[arg(long)]
    route: String,
    /// The topic of the stuck partition.
    #[arg(long)]
    topic: String,
    /// The stuck partition.
    #[arg(long)]
    partition: i32,
    /// Find and print the undecodable offsets; write and commit nothing.
    #[arg(long)]
    dry_run: bool,
}

/// `hopper skip`: past an undecodable batch (docs/connecting.md).
pub async fn skip(args: SkipArgs) -> anyhow::Result<()> {
    let (config, cluster) = args.target.load()?;
    let skipped = tokio::task::block_in_place(|| {
        hopper::dlq::skip_undecodable(
            &cluster,
            &config,
            &args.route,
            &args.topic,
            args.partition,
            args.dry_run,
        )
    })?;
    let range = format!(
        "{}[{}] offsets {} to {}",
        args.topic,
        args.partition,
        skipped.from,
        skipped.to - 1
    );
    match &skipped.dead_letter {
        None => println!(
            "Would skip {range} ({}); group `{}` would resume at {}.",
            skipped.error, skipped.group, skipped.to
        ),
        Some(dead) => println!(
            "Skipped {range} ({}): recorded as {dead}; group `{}` resumes at {}.",
            skipped.error, skipped.group, skipped.to
        ),
    }
    Ok(())
}
