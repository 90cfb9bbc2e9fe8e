//! `hopper parked`: the parked and blocked keys of a route with ordered
//! retries, and an operator's release of one, straight against the
//! brokers (no running hopper needed).

use crate::ops::{Target, clean};
use anyhow::Context as _;
use base64::Engine as _;
use clap::{Args, Subcommand};
use hopper::parked::{self, Lane};

#[derive(Subcommand)]
pub enum ParkedCommand {
    /// Lists the route's parked, blocked and releasing keys, oldest first,
    /// read from its park topic.
    List {
        #[command(flatten)]
        target: Target,
        /// The route (`retry_order = "key"`).
        #[arg(long)]
        route: String,
    },
    /// Releases a parked or blocked key: its waiting messages are handled,
    /// in order, by the hopper that runs its partition, and new ones are no
    /// longer parked or dead-lettered.
    Release(KeyArgs),
    /// Deletes every record of a key from the park topic (its head, its
    /// waiting messages, its releases), straight against the brokers,
    /// whatever a running hopper makes of them: for records hopper did not
    /// write, or a key that must be forgotten. Its waiting messages are
    /// not handled.
    Purge(KeyArgs),
}

/// The key `release` and `purge` act on.
#[derive(Args)]
pub struct KeyArgs {
    #[command(flatten)]
    target: Target,
    /// The route whose park topic holds the key.
    #[arg(long)]
    route: String,
    /// The input topic of the key.
    #[arg(long)]
    topic: String,
    /// The input partition of the key.
    #[arg(long)]
    partition: i32,
    /// The key, as text.
    #[arg(
        long,
        conflicts_with = "key_base64",
        required_unless_present = "key_base64"
    )]
    key: Option<String>,
    /// The key, in base64 (for a key that is not UTF-8).
    #[arg(long)]
    key_base64: Option<String>,
}

pub async fn run(command: ParkedCommand) -> anyhow::Result<()> {
    match command {
        ParkedCommand::List { target, route } => {
            let (config, cluster) = target.load()?;
            let route = find(&config, &route)?;
            let keys = parked::list(&cluster, &route)
                .await
                .with_context(|| format!("reading the park topic of route `{}`", route.name))?;
            if target.json {
                let out = serde_json::json!({ "route": route.name, "keys": keys });
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(());
            }
            if keys.is_empty() {
                println!("Route `{}`: no parked or blocked key.", route.name);
            }
            for k in keys {
                let since = k.since_ms.map_or("-".to_string(), since);
                println!(
                    "{}[{}] key {:?} (base64 {}): {:?} behind {} since {since}, {} message(s) waiting ({} bytes)",
                    clean(&k.lane.topic),
                    k.lane.partition,
                    k.lane.key,
                    k.lane.key_base64,
                    k.state,
                    clean(k.head.as_deref().unwrap_or("-")),
                    k.parked,
                    k.bytes
                );
            }
        }
        ParkedCommand::Release(KeyArgs {
            target,
            route,
            topic,
            partition,
            key,
            key_base64,
        }) => {
            let (config, cluster) = target.load()?;
            let route = find(&config, &route)?;
            let lane = lane(topic, partition, key, key_base64)?;
            let head = parked::release(&cluster, &route, &lane)
                .await
                .with_context(|| format!("releasing {lane} of route `{}`", route.name))?;
            if target.json {
                let out = serde_json::json!({
                    "released": true, "route": route.name, "topic": lane.topic,
                    "partition": lane.partition, "head": head,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!(
                    "Released {} of route `{}` (it was held behind `{}`): its waiting messages are handled next, in order.",
                    clean(&lane.to_string()),
                    route.name,
                    clean(&head)
                );
            }
        }
        ParkedCommand::Purge(KeyArgs {
            target,
            route,
            topic,
            partition,
            key,
            key_base64,
        }) => {
            let (config, cluster) = target.load()?;
            let route = find(&config, &route)?;
            let lane = lane(topic, partition, key, key_base64)?;
            let purged = parked::purge(&cluster, &route, &lane)
                .await
                .with_context(|| format!("purging {lane} of route `{}`", route.name))?;
            if target.json {
                let out = serde_json::json!({
                    "route": route.name, "topic": lane.topic, "partition": lane.partition,
                    "key_base64": base64::engine::general_purpose::STANDARD.encode(&lane.key),
                    "deleted": purged,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!(
                    "Purged {} of route `{}`: deleted {} head, {} waiting message(s) and {} release(s) from its park topic.",
                    clean(&lane.to_string()),
                    route.name,
                    purged.heads,
                    purged.waiting,
                    purged.releases
                );
            }
        }
    }
    Ok(())
}

/// The lane an operator names: `--key`, or `--key-base64`.
fn lane(
    topic: String,
    partition: i32,
    key: Option<String>,
    key_base64: Option<String>,
) -> anyhow::Result<Lane> {
    let key = match (key, key_base64) {
        (Some(key), _) => key.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .context("--key-base64 is not base64")?,
        (None, None) => anyhow::bail!("give --key or --key-base64"),
    };
    Ok(Lane {
        topic,
        partition,
        key,
    })
}

/// When a key parked, as RFC 3339; a time past year 9999 (or before 1970)
/// as its milliseconds.
fn since(ms: i64) -> String {
    /// 9999-12-31T23:59:59Z.
    const LAST: i64 = 253_402_300_799_999;
    if (0..=LAST).contains(&ms) {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64),
        )
        .to_string()
    } else {
        format!("{ms} ms after the epoch")
    }
}

fn find(config: &hopper::config::Config, name: &str) -> anyhow::Result<hopper::config::Route> {
    let route = config
        .routes
        .iter()
        .find(|r| r.name == name)
        .with_context(|| format!("route `{name}` is not in the config"))?;
    anyhow::ensure!(
        route.parking.is_some(),
        "route `{name}` has no ordered retries (retry_order = \"key\")"
    );
    Ok(route.clone())
}
