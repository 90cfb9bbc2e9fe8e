//! Replay runs started through the admin API: a filter's selection of any
//! size, replayed in the background ([`crate::dlq::stream`]) at the
//! server's shared pace, with its status kept in memory for
//! `GET /api/replay/runs/{run}`.
//!
//! Bounds: at most [`MAX_RUNNING`] runs at once (one more is answered 429),
//! the status of the last [`MAX_KEPT`] runs, and in each status the counts
//! and the first [`MAX_OUTCOMES`] outcomes that were not a plain replay.

use super::State;
use super::api::{ApiError, bad_request};
use crate::dlq::replay::{ReplayAction, ReplayOutcome, ReplayReport};
use crate::dlq::run::RunId;
use crate::dlq::stream::{Past, Selection, Step, Stream, StreamError};
use crate::dlq::{Dlq, DlqFilter};
use axum::Json;
use axum::extract::{Path, State as Shared};
use axum::http::StatusCode;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Runs at once; one more is refused with 429.
pub(super) const MAX_RUNNING: usize = 4;
/// Runs whose status the server keeps; past them the oldest finished one
/// is forgotten.
pub(super) const MAX_KEPT: usize = 100;
/// Outcomes a status keeps: the first that were not a plain replay
/// (a REPLAY_LOOP copy, a skip, a failure), to show why.
pub(super) const MAX_OUTCOMES: usize = 100;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Phase {
    Running,
    Done,
    Failed,
}

/// A run's status, as `GET /api/replay/runs/{run}` shows it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RunStatus {
    run: String,
    state: Phase,
    dry_run: bool,
    /// Whether this resumes a run started before.
    resumed: bool,
    filter: DlqFilter,
    replayed: usize,
    looped: usize,
    skipped: usize,
    failed: usize,
    /// Skipped by a resumed run: it replayed them before.
    already: usize,
    /// The first [`MAX_OUTCOMES`] outcomes that were not a plain replay.
    outcomes: Vec<ReplayOutcome>,
    /// Why the run failed or stopped.
    error: Option<String>,
    started_at_ms: i64,
    finished_at_ms: Option<i64>,
}

impl RunStatus {
    fn count(&mut self, report: &ReplayReport) {
        self.replayed = report.replayed;
        self.looped = report.looped;
        self.skipped = report.skipped;
        self.failed = report.failed;
        self.already = report.already;
    }
}

impl RunStatus {
    /// A run just started, running.
    fn new(run: &RunId, filter: DlqFilter, dry_run: bool, resumed: bool) -> RunStatus {
        RunStatus {
            run: run.to_string(),
            state: Phase::Running,
            dry_run,
            resumed,
            filter,
            replayed: 0,
            looped: 0,
            skipped: 0,
            failed: 0,
            already: 0,
            outcomes: Vec::new(),
            error: None,
            started_at_ms: crate::clock::now_ms(),
            finished_at_ms: None,
        }
    }

    /// Counts `outcome` in from `report`, and keeps it when it is not a
    /// plain replay and fewer than [`MAX_OUTCOMES`] are kept.
    fn add(&mut self, outcome: ReplayOutcome, report: &ReplayReport) {
        self.count(report);
        let plain =
            matches!(outcome.action, ReplayAction::Replay { .. }) && outcome.failed.is_none();
        if !plain && self.outcomes.len() < MAX_OUTCOMES {
            self.outcomes.push(outcome);
        }
    }
}

/// The runs this server started, oldest first.
#[derive(Default)]
pub(super) struct Runs {
    // std Mutex: held to read or change a status, never across an .await.
    runs: Mutex<VecDeque<RunStatus>>,
}

impl Runs {
    /// Whether run `run` may start: refused when [`MAX_RUNNING`] run, or
    /// when `run` runs already (a resume of it would replay twice).
    fn check(&self, run: &str) -> Result<(), ApiError> {
        check(&self.runs.lock().unwrap(), run)
    }

    /// Adds `status` as running, when [`Runs::check`] allows it; in place
    /// of the run's earlier status, if any.
    fn begin(&self, status: RunStatus) -> Result<(), ApiError> {
        let mut runs = self.runs.lock().unwrap();
        check(&runs, &status.run)?;
        runs.retain(|r| r.run != status.run);
        while runs.len() >= MAX_KEPT {
            match runs.iter().position(|r| r.state != Phase::Running) {
                Some(oldest) => {
                    runs.remove(oldest);
                }
                None => break,
            }
        }
        runs.push_back(status);
        Ok(())
    }

    fn update(&self, run: &str, change: impl FnOnce(&mut RunStatus)) {
        let mut runs = self.runs.lock().unwrap();
        if let Some(status) = runs.iter_mut().rev().find(|r| r.run == run) {
            change(status);
        }
    }

    fn get(&self, run: &str) -> Option<RunStatus> {
        let runs = self.runs.lock().unwrap();
        runs.iter().rev().find(|r| r.run == run).cloned()
    }
}

fn check(runs: &VecDeque<RunStatus>, run: &str) -> Result<(), ApiError> {
    let running = || runs.iter().filter(|r| r.state == Phase::Running);
    if running().any(|r| r.run == run) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("replay run {run} is running: resume it once it is done or failed"),
        ));
    }
    if running().count() >= MAX_RUNNING {
        return Err(ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_RUNNING} replay runs are running, the most at once; start this one when one is done"
            ),
        ));
    }
    Ok(())
}

/// Starts a run over the matches of `filter`, or resumes run `resume`
/// with it: the run's id, once it runs.
pub(super) async fn start(
    state: &Arc<State>,
    filter: DlqFilter,
    dry_run: bool,
    resume: Option<String>,
) -> Result<RunId, ApiError> {
    filter.check().map_err(bad_request)?;
    let resume = resume
        .map(|r| {
            r.parse::<RunId>()
                .map_err(|e| bad_request(format!("resume: {e}")))
        })
        .transpose()?;
    let (config, cluster) = (state.context.config.clone(), state.context.cluster.clone());
    let selection = Selection::Filter(filter.clone());
    let topics = selection.topics(&Dlq {
        cluster: &cluster,
        config: &config,
    })?;
    let run = resume.clone().unwrap_or_default();
    // Checked before a resume reads the journal, and again as it begins.
    state.runs.check(run.as_str())?;
    let past = match &resume {
        None => None,
        Some(resumed) => {
            let (cluster, resumed) = (cluster.clone(), resumed.clone());
            let loaded =
                tokio::task::spawn_blocking(move || Past::load(&cluster, &topics, &resumed))
                    .await
                    .map_err(|e| StreamError::Task(e.to_string()))
                    .and_then(|past| past);
            match loaded {
                Ok(past) => Some(past),
                Err(e) => {
                    let status = match &e {
                        StreamError::NoSuchRun { .. } => StatusCode::NOT_FOUND,
                        StreamError::Journal(crate::dlq::run::RunError::Malformed { .. }) => {
                            StatusCode::CONFLICT
                        }
                        _ => StatusCode::BAD_GATEWAY,
                    };
                    return Err(ApiError(status, e.to_string()));
                }
            }
        }
    };
    state
        .runs
        .begin(RunStatus::new(&run, filter, dry_run, resume.is_some()))?;
    if let Some(past) = &past {
        for u in &past.unknown {
            tracing::warn!(
                %run,
                record = %u.at,
                to = %u.to,
                "The run stopped while replaying the record, and its destination has too many records since to find its replay: left out, so as never to replay it twice; if the destination lacks it, replay the record by itself."
            );
        }
        tracing::info!(
            %run,
            before = past.done.len(),
            again = past.redo.len(),
            "Resuming a replay run through the admin API."
        );
    }
    if !dry_run {
        // Said before the first record: a server stopped part way leaves
        // the run in the journal, and this line says how to finish it.
        tracing::info!(
            %run,
            "Replay run started through the admin API; if it stops part way, POST /api/replay with the same filter and \"resume\": \"{run}\" (or `hopper dlq replay` with the same selection and `--resume {run}`) replays the rest, none twice."
        );
    }
    let stream = Stream {
        config,
        cluster,
        selection,
        run: run.clone(),
        past,
        dry_run,
        pacer: state.pacer.clone(),
        tracer: state.context.telemetry.tracer().clone(),
        stop: state.stop.clone(),
    };
    let shared = state.clone();
    let id = run.to_string();
    state.tasks.spawn(async move {
        let metrics = shared.context.telemetry.metrics().clone();
        let each = {
            let (shared, id) = (shared.clone(), id.clone());
            move |step: Step, report: &mut ReplayReport| {
                let outcome = match step {
                    Step::Outcome(outcome) => outcome,
                    Step::Already(_) => {
                        shared.runs.update(&id, |status| status.count(report));
                        return;
                    }
                };
                if let (Some(route), None, false) = (&outcome.route, &outcome.failed, dry_run) {
                    let result = match outcome.action {
                        ReplayAction::Replay { .. } => Some("replayed"),
                        ReplayAction::Loop { .. } => Some("loop"),
                        ReplayAction::Skip { .. } => None,
                    };
                    if let Some(result) = result {
                        metrics.inc(&crate::metrics::series::Replays { route, result });
                    }
                }
                shared
                    .runs
                    .update(&id, |status| status.add(outcome, report));
            }
        };
        let ended = stream.run(each).await;
        let finished = crate::clock::now_ms();
        let error = match &ended {
            Ok(report) if report.failed > 0 => Some(format!(
                "{} record(s) could not be replayed; resume run {id} to try them again",
                report.failed
            )),
            Ok(_) => None,
            Err(e) => Some(format!("{e}; resume run {id} to replay the rest")),
        };
        shared.runs.update(&id, |status| {
            if let Ok(report) = &ended {
                status.count(report);
            }
            status.state = if error.is_some() {
                Phase::Failed
            } else {
                Phase::Done
            };
            status.error = error.clone();
            status.finished_at_ms = Some(finished);
        });
        let status = shared.runs.get(&id);
        let (replayed, looped, skipped, failed, already, ms) = status
            .map(|s| {
                let ms = finished - s.started_at_ms;
                (s.replayed, s.looped, s.skipped, s.failed, s.already, ms)
            })
            .unwrap_or_default();
        match error {
            None => tracing::info!(
                run = %id,
                dry_run,
                replayed,
                looped,
                skipped,
                failed,
                already,
                ms,
                "Replay run through the admin API done."
            ),
            Some(error) => tracing::warn!(
                run = %id,
                dry_run,
                replayed,
                looped,
                skipped,
                failed,
                already,
                ms,
                error,
                "Replay run through the admin API failed."
            ),
        }
    });
    Ok(run)
}

/// `GET /api/replay/runs/{run}`: the run's status, while the server keeps
/// it.
pub(super) async fn status(
    Shared(state): Shared<Arc<State>>,
    Path(run): Path<String>,
) -> Result<Json<RunStatus>, ApiError> {
    state.runs.get(&run).map(Json).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "replay run `{}` is not one of the last {MAX_KEPT} this server started",
                crate::headers::shorten(&run.escape_debug().to_string(), 80)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::RecordRef;

    fn started(runs: &Runs, id: &str) -> Result<(), ApiError> {
        let run: RunId = id.parse().unwrap();
        runs.begin(RunStatus::new(&run, DlqFilter::default(), false, false))
    }

    fn finish(runs: &Runs, id: &str) {
        runs.update(id, |s| s.state = Phase::Done);
    }

    #[test]
    fn at_most_four_run_at_once_and_a_running_run_is_not_started_twice() {
        let runs = Runs::default();
        for n in 0..MAX_RUNNING {
            started(&runs, &format!("r{n}")).unwrap();
        }
        let ApiError(status, message) = started(&runs, "r9").unwrap_err();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(message.contains("4 replay runs are running"), "{message}");
        let ApiError(status, message) = started(&runs, "r0").unwrap_err();
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(message.contains("replay run r0 is running"), "{message}");
        finish(&runs, "r0");
        // Done, it can be resumed: the resume takes its place.
        started(&runs, "r0").unwrap();
        assert_eq!(runs.runs.lock().unwrap().len(), MAX_RUNNING);
        assert_eq!(runs.get("r0").unwrap().state, Phase::Running);
    }

    #[test]
    fn the_last_hundred_runs_are_kept() {
        let runs = Runs::default();
        for n in 0..MAX_KEPT + 20 {
            let id = format!("r{n}");
            started(&runs, &id).unwrap();
            finish(&runs, &id);
        }
        assert_eq!(runs.runs.lock().unwrap().len(), MAX_KEPT);
        assert!(runs.get("r19").is_none());
        assert!(runs.get("r20").is_some());
        assert!(runs.get(&format!("r{}", MAX_KEPT + 19)).is_some());
    }

    #[test]
    fn a_status_counts_every_outcome_and_keeps_the_first_hundred_not_plain_replays() {
        let run: RunId = "r1".parse().unwrap();
        let mut status = RunStatus::new(&run, DlqFilter::default(), false, false);
        let mut report = ReplayReport::default();
        let outcome = |offset: i64, action: ReplayAction| ReplayOutcome {
            at: RecordRef {
                topic: "dlq".into(),
                partition: 0,
                offset,
            },
            id: None,
            route: None,
            action,
            failed: None,
        };
        for offset in 0..1_000 {
            let action = if offset % 2 == 0 {
                ReplayAction::Replay {
                    to: "in".into(),
                    replay: 1,
                }
            } else {
                ReplayAction::Skip {
                    problem: "why".into(),
                }
            };
            let o = outcome(offset, action);
            report.count(&o);
            status.add(o, &report);
        }
        assert_eq!((status.replayed, status.skipped), (500, 500));
        assert_eq!(status.outcomes.len(), MAX_OUTCOMES);
        assert!(
            status
                .outcomes
                .iter()
                .all(|o| matches!(o.action, ReplayAction::Skip { .. }))
        );
        assert_eq!(status.outcomes[0].at.offset, 1);
    }
}
