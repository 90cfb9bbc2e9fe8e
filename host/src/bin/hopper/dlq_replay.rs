//! `hopper dlq replay`: a selection of any size, streamed from the
//! dead-letter topics to the producer through a bounded channel, as a
//! resumable run (`hopper::dlq::run`).

use crate::ops::{Filter, Target, blocking, clean};
use anyhow::Context as _;
use hopper::dlq::replay::{Action, Item, Outcome, Replayer, Report};
use hopper::dlq::run::{self, RunId, RunState};
use hopper::dlq::{Dlq, DlqError, Pacer, RecordRef};
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Records a replay lists one line each; past them, a progress line a
/// second.
const LINES: usize = 100;
/// How often the progress line comes.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Matches read ahead of the producer: the memory a replay of any size
/// holds.
const READ_AHEAD: usize = 1_000;

pub struct Replay {
    pub target: Target,
    pub records: Vec<RecordRef>,
    pub filter: Filter,
    pub all: bool,
    pub dry_run: bool,
    pub rate: Option<u32>,
    pub resume: Option<RunId>,
}

/// What a resumed run skips and replays again, from its journal entries.
#[derive(Default)]
struct Past {
    /// Replayed by the run: skipped.
    done: HashSet<RecordRef>,
    /// Recorded by the run, but their replay is not in the destination.
    redo: HashSet<RecordRef>,
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
    let topics: Vec<String> = if records.is_empty() {
        Dlq {
            cluster: &cluster,
            config: &config,
        }
        .topics(filter.route.as_deref())?
    } else {
        let set: std::collections::BTreeSet<String> =
            records.iter().map(|r| r.topic.clone()).collect();
        set.into_iter().collect()
    };
    let run = resume.clone().unwrap_or_default();
    let past = match &resume {
        None => Past::default(),
        Some(run) => {
            let (cluster, topics, run) = (cluster.clone(), topics.clone(), run.clone());
            blocking(move || past(&cluster, &topics, &run)).await?
        }
    };
    let json = target.json;
    if !dry_run && !json {
        eprintln!(
            "Replay run {run}. If it stops before the end, the same command with --resume {run} replays the rest:\n  {}",
            resume_command(&run)
        );
    }

    // The reader: matches, as they are read, into a bounded channel.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u32, OwnedMessage)>(READ_AHEAD);
    let reader = {
        let (config, cluster, except) = (config.clone(), cluster.clone(), resume.clone());
        tokio::task::spawn_blocking(move || -> Result<(), DlqError> {
            let dlq = Dlq {
                cluster: &cluster,
                config: &config,
            };
            if records.is_empty() {
                // A closed channel: the producer side failed, and says why.
                dlq.for_each_match_but(&filter, usize::MAX, except.as_ref(), |s, m| {
                    tx.blocking_send((s.replayed, m)).is_ok()
                })?;
            } else {
                let mut counts = HashMap::new();
                for at in &records {
                    let message = dlq.fetch(at)?;
                    if !counts.contains_key(&at.topic) {
                        let c = hopper::dlq::browse::replay_counts_but(
                            &cluster,
                            &at.topic,
                            except.as_ref(),
                        )?;
                        counts.insert(at.topic.clone(), c);
                    }
                    let replayed = counts[&at.topic].get(at).copied().unwrap_or(0);
                    if tx.blocking_send((replayed, message)).is_err() {
                        break;
                    }
                }
            }
            Ok(())
        })
    };

    // The producer: each match, paced, as one run.
    let pacer = Pacer::new(rate.unwrap_or(config.replay.rate));
    let run2 = run.clone();
    let producer = tokio::task::spawn_blocking(move || {
        let dlq = Dlq {
            cluster: &cluster,
            config: &config,
        };
        // The command exits once done: its spans would not be sent.
        let tracer = hopper::trace::Tracer::default();
        tokio::runtime::Handle::current().block_on(async {
            let mut replayer = Replayer::new(
                &dlq,
                run2,
                config.replay.max_replays,
                dry_run,
                &pacer,
                &tracer,
            )?;
            let mut report = replayer.report();
            let mut progress = Progress::new();
            let size = pacer.batch();
            // A batch: what the channel has ready, up to `size`; never
            // waits for more than the first.
            while let Some(first) = rx.recv().await {
                let mut items = Vec::with_capacity(size);
                let mut next = Some(first);
                while let Some((replayed, message)) = next.take() {
                    let at = RecordRef {
                        topic: message.topic().to_string(),
                        partition: message.partition(),
                        offset: message.offset(),
                    };
                    if past.done.contains(&at) {
                        report.already += 1;
                    } else {
                        let redo = past.redo.contains(&at);
                        items.push(Item {
                            message,
                            replayed,
                            redo,
                        });
                    }
                    if items.len() < size {
                        next = rx.try_recv().ok();
                    }
                }
                if items.is_empty() {
                    continue;
                }
                for outcome in replayer.batch(items).await {
                    report.count(&outcome);
                    if !json {
                        progress.show(&outcome, &report);
                    }
                    if json {
                        report.outcomes.push(outcome);
                    }
                }
            }
            Ok::<Report, DlqError>(report)
        })
    });
    let report = producer.await??;
    reader
        .await?
        .with_context(|| format!("reading the selection; to go on: {}", resume_command(&run)))?;
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

/// What run `run` did in the journals of `topics`: the records it
/// replayed, and those it recorded without producing their replay.
fn past(cluster: &hopper::kafka::Cluster, topics: &[String], run: &RunId) -> anyhow::Result<Past> {
    let state = RunState::load(cluster, topics, run)?;
    if state.entries == 0 {
        let journals: Vec<String> = topics
            .iter()
            .map(|t| format!("`{}`", hopper::config::replay_journal(t)))
            .collect();
        anyhow::bail!(
            "replay run `{run}` is not in {}: it replayed nothing there. Check the run id and the selection; a replay that stopped before its first record is run again without --resume",
            journals.join(", ")
        );
    }
    let checked = run::check(cluster, run, state.unsure)?;
    let mut done = state.done;
    done.extend(checked.replayed);
    for u in checked.unknown {
        eprintln!(
            "Run {run} stopped while replaying {} to `{}`, which has too many records since to find it: left out, so as never to replay it twice. If `{}` lacks it, replay it with --record {}.",
            u.at, u.to, u.to, u.at
        );
        done.insert(u.at);
    }
    eprintln!(
        "Resuming run {run}: {} record(s) replayed before; {} recorded but not produced, replayed again.",
        done.len(),
        checked.missing.len()
    );
    Ok(Past {
        done,
        redo: checked.missing,
    })
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

    fn show(&mut self, o: &Outcome, report: &Report) {
        self.n += 1;
        if self.n <= LINES {
            let (what, to) = match &o.action {
                Action::Replay { to, replay } => (format!("replay #{replay}"), format!(" -> {to}")),
                Action::Loop { to, .. } => ("REPLAY_LOOP".to_string(), format!(" -> {to}")),
                Action::Skip { problem } => (format!("skipped: {}", clean(problem)), String::new()),
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
