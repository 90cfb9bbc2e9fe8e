//! `hopper dlq replay`: a selection of any size, streamed from the
//! dead-letter topics to the producer through a bounded channel, as a
//! resumable run (`hopper::dlq::run`).

use crate::ops::{Filter, Target, blocking, clean};
use hopper::dlq::replay::{ReplayAction, ReplayOutcome, ReplayReport};
use hopper::dlq::run::RunId;
use hopper::dlq::stream::{Past, Selection, Step, Stream, StreamError};
use hopper::dlq::{Dlq, Pacer, RecordRef};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Records a replay lists one line each; past them, a progress line a
/// second.
const LINES: usize = 100;
/// How often the progress line comes.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub struct Replay {
    pub target: Target,
    pub records: Vec<RecordRef>,
    pub filter: Filter,
    pub all: bool,
    pub dry_run: bool,
    pub rate: Option<u32>,
    pub resume: Option<RunId>,
}

pub async fn run(args: Replay) -> anyhow::Result<()> {
    let Replay {
        target,
        records,
        filter,
        all,
        dry_run,
        rate,
        resume,
    } = args;
    if records.is_empty() && filter.is_empty() && !all {
        anyhow::bail!(
            "nothing selected: give --record TOPIC:PARTITION:OFFSET, a filter (--route, --reason, --since, --until, --key, --text, --group, --not-replayed), or --all"
        );
    }
    let (config, cluster) = target.load()?;
    let filter = filter.resolve()?;
    let selection = if records.is_empty() {
        Selection::Filter(filter)
    } else {
        Selection::Records(records)
    };
    let topics = selection.topics(&Dlq {
        cluster: &cluster,
        config: &config,
    })?;
    let run = resume.clone().unwrap_or_default();
    let past = match &resume {
        None => None,
        Some(run) => {
            let (cluster, topics, run) = (cluster.clone(), topics.clone(), run.clone());
            Some(blocking(move || past(&cluster, &topics, &run)).await?)
        }
    };
    let json = target.json;
    if !dry_run && !json {
        eprintln!(
            "Replay run {run}. If it stops before the end, the same command with --resume {run} replays the rest:\n  {}",
            resume_command(&run)
        );
    }
    let stream = Stream {
        pacer: Arc::new(Pacer::new(rate.unwrap_or(config.replay.rate))),
        config: Arc::new(config),
        cluster,
        selection,
        run: run.clone(),
        past,
        dry_run,
        // The command exits once done: its spans would not be sent.
        tracer: hopper::trace::Tracer::default(),
        stop: CancellationToken::new(),
    };
    let mut progress = Progress::new();
    let report = stream
        .run(move |step, report| match step {
            Step::Outcome(outcome) if json => report.outcomes.push(outcome),
            Step::Outcome(outcome) => progress.show(&outcome, report),
            Step::Already(_) => {}
        })
        .await
        .map_err(|e| match e {
            StreamError::Read(_) => {
                anyhow::anyhow!("{e}; to go on: {}", resume_command(&run))
            }
            e => e.into(),
        })?;
    let total = report.replayed + report.looped + report.skipped + report.failed;
    let already = match report.already {
        0 => String::new(),
        n => format!(" {n} more were replayed by run {run} before."),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if dry_run {
        println!(
            "Dry run: {} of {total} record(s) would be replayed, {} would go back with REPLAY_LOOP, {} skipped. Nothing was produced.{already}",
            report.replayed, report.looped, report.skipped,
        );
    } else {
        println!(
            "Replayed {} of {total} record(s); {} went back with REPLAY_LOOP, {} skipped, {} failed.{already}",
            report.replayed, report.looped, report.skipped, report.failed
        );
    }
    if report.failed > 0 {
        anyhow::bail!(
            "{} record(s) could not be replayed; to try them again: {}",
            report.failed,
            resume_command(&run)
        );
    }
    Ok(())
}

/// What run `run` did in the journals of `topics`, said on stderr.
fn past(cluster: &hopper::kafka::Cluster, topics: &[String], run: &RunId) -> anyhow::Result<Past> {
    let past = Past::load(cluster, topics, run)?;
    for u in &past.unknown {
        eprintln!(
            "Run {run} stopped while replaying {} to `{}`, which has too many records since to find it: left out, so as never to replay it twice. If `{}` lacks it, replay it with --record {}.",
            u.at, u.to, u.to, u.at
        );
    }
    eprintln!(
        "Resuming run {run}: {} record(s) replayed before; {} recorded but not produced, replayed again.",
        past.done.len(),
        past.redo.len()
    );
    Ok(past)
}

/// The command line of this process, with `--resume RUN`, quoted for a
/// shell.
fn resume_command(run: &RunId) -> String {
    let mut args = Vec::new();
    let mut skip = false;
    for a in std::env::args() {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--resume" {
            skip = true;
        } else if !a.starts_with("--resume=") {
            args.push(a);
        }
    }
    args.push("--resume".into());
    args.push(run.to_string());
    let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    clean(&quoted.join(" "))
}

fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@,+%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// The replay's stderr: a line per record for the first [`LINES`], then
/// a progress line each [`PROGRESS_EVERY`].
struct Progress {
    n: usize,
    start: Instant,
    shown: Instant,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            n: 0,
            start: Instant::now(),
            shown: Instant::now(),
        }
    }

    fn show(&mut self, o: &ReplayOutcome, report: &ReplayReport) {
        self.n += 1;
        if self.n <= LINES {
            let (what, to) = match &o.action {
                ReplayAction::Replay { to, replay } => {
                    (format!("replay #{replay}"), format!(" -> {to}"))
                }
                ReplayAction::Loop { to, .. } => ("REPLAY_LOOP".to_string(), format!(" -> {to}")),
                ReplayAction::Skip { problem } => {
                    (format!("skipped: {}", clean(problem)), String::new())
                }
            };
            let failed = o
                .failed
                .as_deref()
                .map(|f| format!(" FAILED: {}", clean(f)));
            eprintln!(
                "[{}] {} {what}{to}{}",
                self.n,
                o.at,
                failed.unwrap_or_default()
            );
            if self.n == LINES {
                eprintln!("(from here on, a progress line a second)");
            }
        } else if self.shown.elapsed() >= PROGRESS_EVERY {
            self.shown = Instant::now();
            let secs = self.start.elapsed().as_secs_f64().max(0.001);
            eprintln!(
                "{} {} of {} selected so far ({:.0}/s); {} REPLAY_LOOP, {} skipped, {} failed",
                if report.dry_run {
                    "would replay"
                } else {
                    "replayed"
                },
                report.replayed,
                self.n,
                self.n as f64 / secs,
                report.looped,
                report.skipped,
                report.failed
            );
        }
    }
}
