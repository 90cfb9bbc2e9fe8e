//! `hopper topics` and `hopper acls`: what a config needs of the cluster,
//! from the same lists that create its topics. Neither needs a broker.

use anyhow::Context as _;
use clap::Args;
use hopper::config::{AclsFor, Config, kafka_acls_script};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct TopicsArgs {
    /// The config file.
    #[arg(short, long, default_value = "hopper.toml")]
    config: PathBuf,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AclsArgs {
    /// The config file.
    #[arg(short, long, default_value = "hopper.toml")]
    config: PathBuf,
    /// The principal to grant, e.g. `User:hopper`.
    #[arg(long)]
    principal: String,
    /// Whose ACLs: `run` for `hopper run`, `cli` for an operator's CLI.
    #[arg(long = "for", value_enum, default_value = "run")]
    who: AclsFor,
    /// One JSON array instead of a `kafka-acls.sh` script.
    #[arg(long)]
    json: bool,
}

fn load(path: &Path) -> anyhow::Result<Config> {
    Config::load(path).with_context(|| format!("loading {}", path.display()))
}

pub fn topics(args: TopicsArgs) -> anyhow::Result<()> {
    let config = load(&args.config)?;
    let specs = config.topic_specs();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&specs)?);
        return Ok(());
    }
    println!("topic\twhat\tused by\tpartitions\treplication\tcleanup.policy\tretention.ms");
    for spec in specs {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            spec.topic,
            spec.role.name(),
            spec.users.join(","),
            spec.partitions,
            spec.replication,
            spec.cleanup_policy,
            spec.retention_ms
                .map_or_else(|| "broker default".to_string(), |ms| ms.to_string())
        );
    }
    Ok(())
}

pub fn acls(args: AclsArgs) -> anyhow::Result<()> {
    let config = load(&args.config)?;
    let acls = config.acls(args.who);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&acls)?);
        return Ok(());
    }
    let bootstrap = config.kafka.brokers.as_deref().unwrap_or("BROKERS");
    print!("{}", kafka_acls_script(&acls, &args.principal, bootstrap));
    Ok(())
}
