//! `hopper plugin test HANDLER.wasm CASES`: runs a handler on a cases file
//! with no broker (`hopper::trial`), prints one line per case and the diff
//! of each failure, and exits 1 when any case failed.

use anyhow::Context as _;
use clap::Args;
use hopper::config::Config;
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
}

pub async fn run(args: TestArgs, cache_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
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
    let mut suite = trial::load(&args.cases, &args.handler, from_config)?;
    if let Some(text) = &args.filter {
        suite.cases.retain(|c| c.name.contains(text.as_str()));
    }
    let trial = Trial::new(&args.handler, suite.route.clone(), cache_dir)
        .with_context(|| format!("loading handler {}", args.handler.display()))?;
    let handler = trial.handler();
    println!(
        "Testing {} ({} {}) on {} cases of {}, route `{}`.",
        args.handler.display(),
        handler.name(),
        &handler.version()[..12],
        suite.cases.len(),
        suite.path.display(),
        suite.route.name,
    );
    let mut results = Vec::with_capacity(suite.cases.len());
    let cases_started = Instant::now();
    for case in &suite.cases {
        let result = trial.run(case).await?;
        let mark = if result.passed() { "ok  " } else { "FAIL" };
        println!(
            "{mark} {}  ({}, {})",
            result.name,
            result.summary,
            millis(result.took)
        );
        for block in &result.diff {
            for line in block.lines() {
                println!("       {line}");
            }
        }
        results.push(result);
    }
    let in_cases = cases_started.elapsed();
    let failed = results.iter().filter(|r| !r.passed()).count();
    println!(
        "{} cases: {} passed, {failed} failed. Start-up {} (reading and compiling the handler {}), cases {} ({} per case), in all {}.",
        results.len(),
        results.len() - failed,
        millis(cases_started.duration_since(started)),
        millis(trial.startup),
        millis(in_cases),
        millis(in_cases / u32::try_from(results.len().max(1)).unwrap_or(u32::MAX)),
        millis(started.elapsed()),
    );
    if let Some(path) = &args.junit {
        let suite_name = args.cases.display().to_string();
        let xml = trial::junit::render(
            &suite_name,
            &args.handler.display().to_string(),
            &results,
            trial.startup,
        );
        std::fs::write(path, xml).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.2} ms")
    }
}
