//! `hopper config check`: a config validated as `hopper run` would at
//! start, with no broker.

use clap::{Args, Subcommand};
use hopper::config::{Config, ConfigError};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Validates a config as `hopper run` would at start, with no broker:
    /// every problem at once, each naming its key; every `env:` and `file:`
    /// value read (a missing one named, no value ever shown); every handler
    /// compared with the handler world. Exits 2 on any problem.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    /// The config file.
    #[arg(short, long, default_value = "hopper.toml")]
    config: PathBuf,
    /// The bootstrap servers `hopper run` would be given (`--brokers`):
    /// with them, the config may leave `kafka.brokers` out.
    #[arg(long, env = "HOPPER_BROKERS")]
    brokers: Option<String>,
}

pub fn run(command: ConfigCommand) -> anyhow::Result<()> {
    let ConfigCommand::Check(args) = command;
    check(args)
}

/// Loads the config (every problem of the file, its `env:` and `file:`
/// values read), then what `hopper run` checks next: that it has brokers,
/// and that each handler fits the handler world. Fails with every problem.
fn check(args: CheckArgs) -> anyhow::Result<()> {
    let path = args.config;
    let config = Config::load(&path)?;
    let mut problems = Vec::new();
    let brokers = args
        .brokers
        .or_else(|| config.kafka.brokers.clone())
        .filter(|b| !b.trim().is_empty());
    if brokers.is_none() {
        problems.push(
            "kafka.brokers is not set: set it, or give `hopper run` --brokers (HOPPER_BROKERS), or --embedded for a trial"
                .to_string(),
        );
    }
    let runtime = hopper::plugin::Runtime::new(64 << 20)?;
    let mut checked = BTreeSet::new();
    for route in &config.routes {
        if !checked.insert(route.handler.clone()) {
            continue;
        }
        let handler = route.handler.display();
        match runtime.fit(&route.handler) {
            Ok(fit) => {
                if let Some(why) = &fit.error {
                    problems.push(format!("route `{}`: handler {handler}: {why}", route.name));
                }
            }
            Err(e) => problems.push(format!("route `{}`: handler {handler}: {e:#}", route.name)),
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError::Invalid { path, problems }.into());
    }
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    let mut parts = vec![format!("{} route(s) ({})", names.len(), names.join(", "))];
    if config.delay.is_some() {
        parts.push("the delay relay".into());
    }
    if let Some(admin) = &config.admin {
        parts.push(format!("the admin server on {}", admin.listen));
    }
    println!(
        "ok: {}: {}; every handler fits {}.",
        path.display(),
        parts.join(", "),
        hopper::plugin::WORLD
    );
    for warning in config.kafka.weakened_security() {
        println!("warning: {warning}");
    }
    Ok(())
}
