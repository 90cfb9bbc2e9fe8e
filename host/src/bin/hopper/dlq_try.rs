//! `hopper dlq try --route R --handler NEW.wasm [filters]`: a candidate
//! handler called on the route's dead letters (`hopper::dlq::candidate`),
//! straight against the brokers. Reads only; writes nothing to any topic.

use crate::ops::{Filter, Target, blocking, clean, table};
use anyhow::Context as _;
use clap::Args;
use hopper::dlq::{Dlq, HttpMode, try_candidate};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct TryArgs {
    #[command(flatten)]
    target: Target,
    /// Which records (--route is required: the candidate runs under that
    /// route's limits and grants).
    #[command(flatten)]
    filter: Filter,
    /// The candidate handler component.
    #[arg(long)]
    handler: PathBuf,
    /// Where the candidate's HTTP requests go: `deny` (nowhere: every
    /// request is denied) or `live` (the hosts the route grants).
    #[arg(long, default_value = "deny", value_parser = http_mode)]
    http: HttpMode,
    /// Let the candidate read the route's `[route.secrets]`. Off by
    /// default: a candidate that asks for a secret is told it is not
    /// granted, so code not yet trusted cannot put one in its reason
    #[arg(long)]
    with_secrets: bool,
    /// Records to try at most; more matches is an error (narrow the
    /// filters).
    #[arg(long, default_value_t = 100_000)]
    max: usize,
    /// Calls at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Print only the totals, not a line per record.
    #[arg(long)]
    quiet: bool,
}

fn http_mode(text: &str) -> Result<HttpMode, String> {
    match text {
        "deny" => Ok(HttpMode::Deny),
        "live" => Ok(HttpMode::Live),
        other => Err(format!("`{other}` is not deny or live")),
    }
}

pub async fn run(args: TryArgs, cache_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let Some(route_name) = args.filter.route.clone() else {
        anyhow::bail!(
            "give --route: the candidate runs under one route's limits and grants, on that route's dead letters"
        );
    };
    let (config, cluster) = args.target.load()?;
    let route = config
        .routes
        .iter()
        .find(|r| r.name == route_name)
        .cloned()
        .with_context(|| {
            format!(
                "route `{route_name}` is not in {}",
                args.target_config().display()
            )
        })?;
    let bytes = std::fs::read(&args.handler)
        .with_context(|| format!("reading handler {}", args.handler.display()))?;
    let (handler, tried_route) = hopper::dlq::candidate::load_candidate(
        &args.handler,
        &bytes,
        &route,
        args.http,
        args.with_secrets,
        cache_dir,
    )
    .with_context(|| format!("loading handler {}", args.handler.display()))?;
    let filter = args.filter.resolve()?;
    let max = args.max;
    let started = Instant::now();
    let selected = blocking(move || {
        Dlq {
            cluster: &cluster,
            config: &config,
        }
        .select(&filter, max)
    })
    .await?;
    let read_in = started.elapsed();
    let json = args.target.json;
    let quiet = args.quiet || json;
    let http = match args.http {
        HttpMode::Deny => "HTTP denied: every request the candidate makes fails",
        HttpMode::Live => "HTTP live: requests go to the hosts the route grants",
    };
    let secrets = if args.with_secrets {
        "secrets granted as the route grants them"
    } else {
        "no secrets"
    };
    if !json {
        println!(
            "Trying {} ({}) on {} dead letters of route `{}`; {http}; {secrets}. Nothing is written to any topic.",
            clean(&args.handler.display().to_string()),
            &handler.version()[..12],
            selected.len(),
            clean(&route.name),
        );
    }
    let calls_started = Instant::now();
    let report = try_candidate(
        &handler,
        &tried_route,
        args.http,
        selected,
        args.concurrency,
        |t| {
            if quiet {
                return;
            }
            // Every field but the outcome and class (hopper's own words)
            // comes from a producer or the candidate: cleaned, one line.
            let line = |text: &str| clean(text).replace('\n', "\\n");
            let was = line(t.was.as_deref().unwrap_or("?"));
            let now = match (t.outcome, t.reason_class, &t.reason) {
                ("ok", _, _) => "ok".to_string(),
                (outcome, class, reason) => format!(
                    "{outcome} {}{}",
                    class.unwrap_or_default(),
                    reason
                        .as_deref()
                        .map(|r| format!(": {}", line(r)))
                        .unwrap_or_default()
                ),
            };
            let key = t
                .key
                .as_deref()
                .map(|k| format!(" key {}", line(k)))
                .unwrap_or_default();
            println!(
                "{} {}{key} {was} -> {now}",
                line(&t.at.to_string()),
                line(t.id.as_deref().unwrap_or("-"))
            );
        },
    )
    .await;
    let calls_in = calls_started.elapsed();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let rows = report
        .why
        .iter()
        .take(20)
        .map(|w| {
            vec![
                w.count.to_string(),
                w.outcome.to_string(),
                w.reason_class.unwrap_or_default().to_string(),
                w.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["RECORDS", "OUTCOME", "CLASS", "REASON"], rows)
    );
    if report.why.len() > 20 {
        println!(
            "({} more reasons; --json lists every record)",
            report.why.len() - 20
        );
    }
    println!(
        "{} tried: {} would succeed, {} would retry, {} would be dead-lettered again, {} skipped; {} records emitted (none produced). Read in {:.2} s, called in {:.2} s ({:.0} records/s).",
        report.total,
        report.ok,
        report.retry,
        report.dead,
        report.skipped,
        report.emitted,
        read_in.as_secs_f64(),
        calls_in.as_secs_f64(),
        report.total as f64 / calls_in.as_secs_f64().max(1e-9),
    );
    Ok(())
}

impl TryArgs {
    fn target_config(&self) -> &std::path::Path {
        self.target.config_path()
    }
}
