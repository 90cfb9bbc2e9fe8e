//! `hopper plugin test HANDLER.wasm CASES`: runs a handler on a cases file
//! with no broker (`hopper::trial`), prints one line per case and the diff
//! of each failure, and exits 1 when any case failed. What the handler and
//! the host log while a case runs is printed under that case, indented.
//!
//! [`Suite::run`] is the runner; `hopper dev` runs it on every change.

use crate::capture::Capture;
use anyhow::Context as _;
use clap::Args;
use hopper::config::{Config, Route};
use hopper::plugin::Compiler;
use hopper::trial::{self, Trial};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TestArgs {
    /// The handler component.
    handler: PathBuf,
    /// The cases file: TOML, or JSON when it ends in `.json`
    /// (docs/writing-handlers.md, "Testing a handler").
    cases: PathBuf,
    /// Run under this route of a hopper config (its limits, grants, config
    /// values and secrets) instead of the cases file's `[route]` table.
    #[arg(long, requires = "route")]
    config: Option<PathBuf>,
    /// The route of --config.
    #[arg(long, requires = "config")]
    route: Option<String>,
    /// Also write the results as JUnit XML to this file, for CI.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Run only the cases whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// Also show the handler's info log lines under each case (by default
    /// only warnings and errors, the handler's and the host's).
    #[arg(long)]
    pub logs: bool,
}

/// A handler and its cases, to run.
pub struct Suite {
    pub handler: PathBuf,
    pub cases: PathBuf,
    /// A route of a hopper config instead of the cases file's `[route]`.
    pub from_config: Option<Route>,
    pub filter: Option<String>,
    pub junit: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub compiler: Compiler,
}

/// A piece of a suite's output, as it comes.
pub enum Piece {
    /// The line naming the handler and the cases, the handler's load-time
    /// log lines, or the closing summary.
    Line(String),
    /// A case's result line, then its diff and its log lines, indented.
    Case { passed: bool, lines: Vec<String> },
}

/// What a suite came to.
pub struct Ran {
    pub passed: usize,
    pub failed: usize,
    /// sha256 of the handler that ran, in hex.
    pub version: String,
    /// Reading and compiling the handler.
    pub startup: Duration,
}

/// The indent of a case's diff and log lines under its result line.
const INDENT: &str = "       ";

pub async fn run(
    args: TestArgs,
    cache_dir: Option<PathBuf>,
    compiler: Compiler,
) -> anyhow::Result<ExitCode> {
    // Named first: a cases file is checked against the handler's path.
    std::fs::metadata(&args.handler)
        .with_context(|| format!("cannot read handler {}", args.handler.display()))?;
    let from_config = match (&args.config, &args.route) {
        (Some(path), Some(name)) => {
            let config =
                Config::load(path).with_context(|| format!("loading {}", path.display()))?;
            let known: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
            let route = config
                .routes
                .iter()
                .find(|r| &r.name == name)
                .cloned()
                .with_context(|| {
                    format!(
                        "route `{name}` is not in {} (its routes: {})",
                        path.display(),
                        known.join(", ")
                    )
                })?;
            Some(route)
        }
        _ => None,
    };
    let suite = Suite {
        handler: args.handler,
        cases: args.cases,
        from_config,
        filter: args.filter,
        junit: args.junit,
        cache_dir,
        compiler,
    };
    let ran = suite
        .run_apart(|piece| match piece {
            Piece::Line(line) => println!("{line}"),
            Piece::Case { lines, .. } => lines.iter().for_each(|l| println!("{l}")),
        })
        .await?;
    Ok(if ran.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

impl Suite {
    /// [`Suite::run`] on a thread of its own, with a runtime of its own, so
    /// that the log lines its thread captures are its cases' own.
    pub async fn run_apart(self, out: impl FnMut(Piece) + Send + 'static) -> anyhow::Result<Ran> {
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the cases' runtime")?;
            runtime.block_on(self.run(out))
        })
        .await
        .context("the cases' thread failed")?
    }

    /// Loads the handler and the cases and runs each case, giving `out` the
    /// output piece by piece; writes the JUnit file when asked. The calling
    /// thread's log lines are captured meanwhile and put under the case
    /// that caused them.
    pub async fn run(self, mut out: impl FnMut(Piece)) -> anyhow::Result<Ran> {
        let started = Instant::now();
        let capture = Capture::start();
        let mut suite = trial::load(&self.cases, &self.handler, self.from_config)?;
        if let Some(text) = &self.filter {
            suite.cases.retain(|c| c.name.contains(text.as_str()));
        }
        let trial = Trial::new(
            &self.handler,
            suite.route.clone(),
            self.cache_dir,
            self.compiler,
        )
        .with_context(|| format!("loading handler {}", self.handler.display()))?;
        let handler = trial.handler();
        out(Piece::Line(format!(
            "Testing {} ({} {}, compiled by {}) on {} cases of {}, route `{}`.",
            self.handler.display(),
            handler.name(),
            &handler.version()[..12],
            trial.compiler(),
            suite.cases.len(),
            suite.path.display(),
            suite.route.name,
        )));
        for line in capture.take() {
            out(Piece::Line(format!("{INDENT}log: {line}")));
        }
        let mut results = Vec::with_capacity(suite.cases.len());
        let cases_started = Instant::now();
        for case in &suite.cases {
            let result = trial.run(case).await?;
            let passed = result.passed();
            let mark = if passed { "ok  " } else { "FAIL" };
            let mut lines = vec![format!(
                "{mark} {}  ({}, {})",
                result.name,
                result.summary,
                millis(result.took)
            )];
            for block in &result.diff {
                lines.extend(block.lines().map(|line| format!("{INDENT}{line}")));
            }
            lines.extend(
                capture
                    .take()
                    .into_iter()
                    .map(|line| format!("{INDENT}log: {line}")),
            );
            out(Piece::Case { passed, lines });
            results.push(result);
        }
        drop(capture);
        let in_cases = cases_started.elapsed();
        let failed = results.iter().filter(|r| !r.passed()).count();
        out(Piece::Line(format!(
            "{} cases: {} passed, {failed} failed. Start-up {} (reading and compiling the handler {}), cases {} ({} per case), in all {}.",
            results.len(),
            results.len() - failed,
            millis(cases_started.duration_since(started)),
            millis(trial.startup),
            millis(in_cases),
            millis(in_cases / u32::try_from(results.len().max(1)).unwrap_or(u32::MAX)),
            millis(started.elapsed()),
        )));
        if let Some(path) = &self.junit {
            let suite_name = self.cases.display().to_string();
            let xml = trial::junit::render(
                &suite_name,
                &self.handler.display().to_string(),
                &results,
                trial.startup,
            );
            std::fs::write(path, xml).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(Ran {
            passed: results.len() - failed,
            failed,
            version: trial.handler().version().to_string(),
            startup: trial.startup,
        })
    }
}

pub fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.2} ms")
    }
}
