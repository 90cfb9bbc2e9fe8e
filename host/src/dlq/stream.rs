//! A replay of a selection of any size, streamed: the matches are read
//! into a bounded channel ([`READ_AHEAD`]) while a [`Replayer`] takes them
//! out in batches, so a replay holds the channel and one batch, never the
//! selection. `hopper dlq replay` and the admin API's replay runs both
//! replay through [`Stream::run`].
//!
//! A resumed run ([`Past`]) skips what its journal entries say it replayed
//! and replays again what they recorded without producing ([`super::run`]).

use super::browse::{Dlq, DlqError, DlqFilter, replay_counts_but};
use super::record::RecordRef;
use super::replay::{Item, Pacer, ReplayOutcome, ReplayReport, Replayer};
use super::run::{self, RunError, RunId, RunState, Unsure};
use crate::config::{Config, replay_journal};
use crate::kafka::Cluster;
use crate::trace::Tracer;
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Matches read ahead of the producer: the memory a replay of any size
/// holds.
pub const READ_AHEAD: usize = 1_000;

/// What a replay takes: records named one by one, or every match of a
/// filter.
#[derive(Debug, Clone)]
pub enum Selection {
    Records(Vec<RecordRef>),
    Filter(DlqFilter),
}

impl Selection {
    /// The dead-letter topics it reads from: those whose journals a
    /// resume reads.
    pub fn topics(&self, dlq: &Dlq<'_>) -> Result<Vec<String>, DlqError> {
        match self {
            Selection::Filter(filter) => dlq.topics(filter.route.as_deref()),
            Selection::Records(records) => {
                let set: BTreeSet<String> = records.iter().map(|r| r.topic.clone()).collect();
                Ok(set.into_iter().collect())
            }
        }
    }
}

/// Why a replay could not run, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(
        "replay run `{run}` is not in {journals}: it replayed nothing there. Check the run id and the selection; a replay that stopped before its first record is run again, not resumed"
    )]
    NoSuchRun { run: RunId, journals: String },
    #[error(transparent)]
    Journal(#[from] RunError),
    #[error("reading the selection: {0}")]
    Read(DlqError),
    #[error(transparent)]
    Replay(DlqError),
    #[error("stopped before the end of the selection")]
    Stopped,
    #[error("the replay's task ended: {0}")]
    Task(String),
}

/// What a resumed run skips and replays again, from its journal entries.
#[derive(Debug, Default)]
pub struct Past {
    /// Replayed by the run: skipped.
    pub done: HashSet<RecordRef>,
    /// Recorded by the run, but their replay is not in the destination.
    pub redo: HashSet<RecordRef>,
    /// Recorded by the run in a batch it may not have produced, and the
    /// destination has too many records since to tell: in `done`, so as
    /// never to replay them twice.
    pub unknown: Vec<Unsure>,
}

impl Past {
    /// What run `run` did in the journals of `topics`: the records it
    /// replayed, and those it recorded without producing their replay.
    /// Blocks on the brokers. A run with no entry there is an error.
    pub fn load(cluster: &Cluster, topics: &[String], run: &RunId) -> Result<Past, StreamError> {
        let state = RunState::load(cluster, topics, run)?;
        if state.entries == 0 {
            let journals: Vec<String> = topics
                .iter()
                .map(|t| format!("`{}`", replay_journal(t)))
                .collect();
            return Err(StreamError::NoSuchRun {
                run: run.clone(),
                journals: journals.join(", "),
            });
        }
        let checked = run::check(cluster, run, state.unsure).map_err(RunError::from)?;
        let mut done = state.done;
        done.extend(checked.replayed);
        done.extend(checked.unknown.iter().map(|u| u.at.clone()));
        Ok(Past {
            done,
            redo: checked.missing,
            unknown: checked.unknown,
        })
    }
}

/// One step of a run, as [`Stream::run`] reports it.
#[derive(Debug)]
pub enum Step {
    /// A record replayed, copied back with REPLAY_LOOP, skipped or failed.
    Outcome(ReplayOutcome),
    /// A record the resumed run replayed before: skipped, counted in
    /// `already`.
    Already(RecordRef),
}

/// One replay run over a selection, ready to go.
pub struct Stream {
    pub config: Arc<Config>,
    pub cluster: Cluster,
    pub selection: Selection,
    pub run: RunId,
    /// When this resumes `run`: what it did before.
    pub past: Option<Past>,
    pub dry_run: bool,
    /// Paces the produces; shared by the replays of one process.
    pub pacer: Arc<Pacer>,
    pub tracer: Tracer,
    /// Looked at between batches: once cancelled, the run stops there
    /// ([`StreamError::Stopped`]), to be resumed.
    pub stop: CancellationToken,
}

impl Stream {
    /// Replays the selection: each step is counted into the report, then
    /// passed to `each` with it (which may keep an outcome in
    /// `report.outcomes`).
    /// The report at the end; an error when the selection could not be
    /// read to its end or the run stopped, after the outcomes so far.
    pub async fn run(
        self,
        mut each: impl FnMut(Step, &mut ReplayReport) + Send + 'static,
    ) -> Result<ReplayReport, StreamError> {
        let Stream {
            config,
            cluster,
            selection,
            run,
            past,
            dry_run,
            pacer,
            tracer,
            stop,
        } = self;
        let except = past.as_ref().map(|_| run.clone());
        let past = past.unwrap_or_default();

        // The reader: matches, as they are read, into a bounded channel.
        // Dropped by the producer side (done, failed or stopped), the
        // channel refuses the next match and the reader ends.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(u32, OwnedMessage)>(READ_AHEAD);
        let reader = {
            let (config, cluster) = (config.clone(), cluster.clone());
            tokio::task::spawn_blocking(move || -> Result<(), DlqError> {
                let dlq = Dlq {
                    cluster: &cluster,
                    config: &config,
                };
                match selection {
                    Selection::Filter(filter) => {
                        dlq.for_each_match_but(&filter, usize::MAX, except.as_ref(), |s, m| {
                            tx.blocking_send((s.replayed, m)).is_ok()
                        })?;
                    }
                    Selection::Records(records) => {
                        let mut counts = HashMap::new();
                        for at in &records {
                            let message = dlq.fetch(at)?;
                            if !counts.contains_key(&at.topic) {
                                let c = replay_counts_but(&cluster, &at.topic, except.as_ref())?;
                                counts.insert(at.topic.clone(), c);
                            }
                            let replayed = counts[&at.topic].get(at).copied().unwrap_or(0);
                            if tx.blocking_send((replayed, message)).is_err() {
                                break;
                            }
                        }
                    }
                }
                Ok(())
            })
        };

        // The producer: each match, paced, in batches.
        let producer = tokio::task::spawn_blocking(move || {
            let dlq = Dlq {
                cluster: &cluster,
                config: &config,
            };
            tokio::runtime::Handle::current().block_on(async {
                let mut replayer = Replayer::new(
                    &dlq,
                    run,
                    config.replay.max_replays,
                    dry_run,
                    &pacer,
                    &tracer,
                )
                .map_err(StreamError::Replay)?;
                let mut report = replayer.report();
                let size = pacer.batch();
                // A batch: what the channel has ready, up to `size`; never
                // waits for more than the first.
                while let Some(first) = rx.recv().await {
                    if stop.is_cancelled() {
                        return Err(StreamError::Stopped);
                    }
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
                            each(Step::Already(at), &mut report);
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
                        each(Step::Outcome(outcome), &mut report);
                    }
                }
                Ok(report)
            })
        });
        let report = producer
            .await
            .map_err(|e| StreamError::Task(e.to_string()))??;
        reader
            .await
            .map_err(|e| StreamError::Task(e.to_string()))?
            .map_err(StreamError::Read)?;
        Ok(report)
    }
}
