//! Hopper config files for tests, built table by table rather than written
//! out with `format!`: [`ConfigBuilder`] holds the `[kafka]` table (on the
//! test broker unless told otherwise), [`RouteTable`]s, a [`DelayTable`],
//! an [`AdminTable`] and tables of keys alone (`[replay]`, `[limits]`,
//! `[tracing]`), and emits the TOML.
//!
//! Only what the tests use has a method of its own; the `key` methods take
//! any other key with its value as TOML.

use crate::{TestConfig, TestRoute, brokers, rand_name};
use std::fmt::{Display, Write as _};
use std::path::Path;

/// `text` as a TOML basic string, for a value the `key` methods take.
pub fn quoted(text: impl Display) -> String {
    let text = text.to_string();
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `key` as a TOML key: bare when it can be.
fn key_name(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare { key.to_string() } else { quoted(key) }
}

/// `items` as a TOML array of strings.
fn array<T: Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(quoted).collect();
    format!("[{}]", items.join(", "))
}

/// Keys and their values (as TOML), in the order they were set.
#[derive(Debug, Clone, Default)]
struct Keys(Vec<(String, String)>);

impl Keys {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|(k, _)| k != key);
        self.0.push((key.to_string(), value));
    }

    fn write(&self, out: &mut String) {
        for (key, value) in &self.0 {
            writeln!(out, "{key} = {value}").unwrap();
        }
    }

    /// `[name]` and its keys, or nothing when it has none.
    fn write_table(&self, name: &str, out: &mut String) {
        if !self.0.is_empty() {
            writeln!(out, "\n[{name}]").unwrap();
            self.write(out);
        }
    }
}

/// Where the `[kafka]` table points.
#[derive(Debug, Clone)]
enum Kafka {
    /// The test broker (resolved when the TOML is written).
    TestBroker,
    /// Brokers of the test's own (an embedded cluster, a secured broker).
    Brokers(String),
    /// Only `partitions`: the brokers come from elsewhere (the test's
    /// loader, or the environment).
    Unnamed,
    /// No `[kafka]` table at all.
    Absent,
}

/// A hopper config file. [`ConfigBuilder::new`] starts with a `[kafka]`
/// table on the test broker that creates topics of two partitions.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    kafka: Kafka,
    partitions: i32,
    kafka_properties: Vec<(String, String)>,
    routes: Vec<RouteTable>,
    delay: Option<DelayTable>,
    admin: Option<AdminTable>,
    /// `[replay]`, `[limits]`, `[tracing]`: tables of keys alone.
    tables: Vec<(&'static str, Keys)>,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigBuilder {
    /// A `[kafka]` table on the test broker, two partitions a topic, and
    /// nothing else yet.
    pub fn new() -> ConfigBuilder {
        ConfigBuilder {
            kafka: Kafka::TestBroker,
            partitions: 2,
            kafka_properties: Vec::new(),
            routes: Vec::new(),
            delay: None,
            admin: None,
            tables: Vec::new(),
        }
    }

    /// Topics hopper creates get `partitions` partitions.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// The `[kafka]` table names `brokers` instead of the test broker.
    pub fn brokers(mut self, brokers: impl Display) -> Self {
        self.kafka = Kafka::Brokers(brokers.to_string());
        self
    }

    /// The `[kafka]` table names no brokers (only `partitions`).
    pub fn unnamed_brokers(mut self) -> Self {
        self.kafka = Kafka::Unnamed;
        self
    }

    /// No `[kafka]` table: for a route resolved without a broker.
    pub fn without_kafka(mut self) -> Self {
        self.kafka = Kafka::Absent;
        self
    }

    /// A librdkafka property in `[kafka.properties]`.
    pub fn kafka_property(mut self, key: &str, value: impl Display) -> Self {
        self.kafka_properties
            .push((key.to_string(), value.to_string()));
        self
    }

    /// One more `[[route]]` table.
    pub fn route(mut self, route: RouteTable) -> Self {
        self.routes.push(route);
        self
    }

    /// The `[delay]` table: the delay relay.
    pub fn delay(mut self, delay: DelayTable) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The `[admin]` table.
    pub fn admin(mut self, admin: AdminTable) -> Self {
        self.admin = Some(admin);
        self
    }

    /// A key of the top-level table `[TABLE]` (`replay`, `limits`,
    /// `tracing`), its value as TOML.
    pub fn key(mut self, table: &'static str, key: &str, value: impl Display) -> Self {
        match self.tables.iter_mut().find(|(name, _)| *name == table) {
            Some((_, keys)) => keys.set(key, value.to_string()),
            None => {
                let mut keys = Keys::default();
                keys.set(key, value.to_string());
                self.tables.push((table, keys));
            }
        }
        self
    }

    /// The `[replay]` table: at most `max_replays` replays of a record,
    /// `rate` records a second.
    pub fn replay(self, max_replays: u32, rate: u32) -> Self {
        self.key("replay", "max_replays", max_replays)
            .key("replay", "rate", rate)
    }

    /// The routes, as added.
    pub fn routes(&self) -> &[RouteTable] {
        &self.routes
    }

    /// The config file's text.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        let brokers = match &self.kafka {
            Kafka::TestBroker => Some(brokers()),
            Kafka::Brokers(brokers) => Some(brokers.clone()),
            Kafka::Unnamed => None,
            Kafka::Absent => None,
        };
        if !matches!(self.kafka, Kafka::Absent) {
            out.push_str("[kafka]\n");
            if let Some(brokers) = brokers {
                writeln!(out, "brokers = {}", quoted(brokers)).unwrap();
            }
            writeln!(out, "partitions = {}", self.partitions).unwrap();
            if !self.kafka_properties.is_empty() {
                out.push_str("\n[kafka.properties]\n");
                for (key, value) in &self.kafka_properties {
                    writeln!(out, "{} = {}", quoted(key), quoted(value)).unwrap();
                }
            }
        }
        for route in &self.routes {
            route.write(&mut out);
        }
        if let Some(delay) = &self.delay {
            out.push_str("\n[delay]\n");
            delay.keys.write(&mut out);
        }
        if let Some(admin) = &self.admin {
            admin.keys.write_table("admin", &mut out);
        }
        for (table, keys) in &self.tables {
            keys.write_table(table, &mut out);
        }
        out
    }

    /// Writes the file into a directory of its own.
    pub fn write(&self) -> TestConfig {
        TestConfig::raw(&self.toml())
    }

    /// Writes the file, for a test of its first route.
    ///
    /// # Panics
    ///
    /// If it has no route.
    pub fn test_route(&self) -> TestRoute {
        let route = self.routes.first().expect("a config with a route");
        let TestConfig { dir, path } = self.write();
        TestRoute {
            name: route.name.clone(),
            input: route.input().to_string(),
            dlq: route.dlq(),
            dir,
            config_path: path,
        }
    }
}

/// A `[[route]]` table.
#[derive(Debug, Clone)]
pub struct RouteTable {
    name: String,
    topics: Vec<String>,
    handler: String,
    keys: Keys,
    /// `[route.config]`, `[route.secrets]`, `[route.emit]`, ...: the
    /// sub-table's name after `route.`, and its keys.
    tables: Vec<(&'static str, Keys)>,
}

impl RouteTable {
    /// A route around `handler` with a name no other test uses, reading
    /// `NAME.in`.
    pub fn new(handler: &Path) -> RouteTable {
        RouteTable::named(&rand_name("route"), handler)
    }

    /// Route `name` around `handler`, reading `NAME.in`.
    pub fn named(name: &str, handler: &Path) -> RouteTable {
        RouteTable {
            name: name.to_string(),
            topics: vec![format!("{name}.in")],
            handler: handler.display().to_string(),
            keys: Keys::default(),
            tables: Vec::new(),
        }
    }

    /// The route, renamed `name`, reading `NAME.in`.
    pub fn rename(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self.topics = vec![format!("{name}.in")];
        self
    }

    /// The route reads `topics` instead of `NAME.in`.
    pub fn topics(mut self, topics: &[&str]) -> Self {
        self.topics = topics.iter().map(|t| t.to_string()).collect();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first topic the route reads.
    pub fn input(&self) -> &str {
        &self.topics[0]
    }

    /// The route's dead-letter topic, by hopper's default name.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// Any key of the route, its value as TOML.
    pub fn key(mut self, key: &str, value: impl Display) -> Self {
        self.keys.set(key, value.to_string());
        self
    }

    /// `retry`: the route's retry tiers.
    pub fn retry(self, tiers: &[&str]) -> Self {
        self.key("retry", array(tiers))
    }

    pub fn max_attempts(self, attempts: u32) -> Self {
        self.key("max_attempts", attempts)
    }

    /// `timeout`: how long a call may run.
    pub fn timeout(self, timeout: &str) -> Self {
        self.key("timeout", quoted(timeout))
    }

    pub fn memory_mib(self, mib: u32) -> Self {
        self.key("memory_mib", mib)
    }

    /// `ordering`: `partition`, `key` or `unordered`.
    pub fn ordering(self, ordering: &str) -> Self {
        self.key("ordering", quoted(ordering))
    }

    pub fn max_in_flight(self, calls: u32) -> Self {
        self.key("max_in_flight", calls)
    }

    /// `on_trap`: what a trap comes to.
    pub fn on_trap(self, policy: &str) -> Self {
        self.key("on_trap", quoted(policy))
    }

    /// `instance`: the instance policy.
    pub fn instance(self, policy: &str) -> Self {
        self.key("instance", quoted(policy))
    }

    /// `allowed_hosts`: the hosts the handler may reach over HTTP.
    pub fn allowed_hosts(self, hosts: &[impl Display]) -> Self {
        self.key("allowed_hosts", array(hosts))
    }

    /// `emit_topics`: the topics the handler may emit to.
    pub fn emit_topics(self, topics: &[impl Display]) -> Self {
        self.key("emit_topics", array(topics))
    }

    /// `cancel_ids`: the delayed messages the handler may cancel.
    pub fn cancel_ids(self, ids: &[impl Display]) -> Self {
        self.key("cancel_ids", array(ids))
    }

    /// A key of the route's sub-table `[route.TABLE]`, its value as TOML.
    pub fn table_key(mut self, table: &'static str, key: &str, value: impl Display) -> Self {
        match self.tables.iter_mut().find(|(name, _)| *name == table) {
            Some((_, keys)) => keys.set(key, value.to_string()),
            None => {
                let mut keys = Keys::default();
                keys.set(key, value.to_string());
                self.tables.push((table, keys));
            }
        }
        self
    }

    /// A value of `[route.config]`, the handler's config.
    pub fn config(self, key: &str, value: impl Display) -> Self {
        self.table_key("config", &key_name(key), quoted(value))
    }

    /// A secret of `[route.secrets]`: `env:NAME` or `file:PATH`.
    pub fn secret(self, key: &str, source: impl Display) -> Self {
        self.table_key("secrets", &key_name(key), quoted(source))
    }

    /// `[route.emit]`: at most `records` records of at most `bytes` in
    /// all per call.
    pub fn emit_limits(self, records: u32, bytes: u32) -> Self {
        self.table_key("emit", "max_records", records)
            .table_key("emit", "max_bytes", bytes)
    }

    /// A key of `[route.http]`, its value as TOML.
    pub fn http(self, key: &str, value: impl Display) -> Self {
        self.table_key("http", key, value)
    }

    /// A key of `[route.breaker]`, its value as TOML.
    pub fn breaker(self, key: &str, value: impl Display) -> Self {
        self.table_key("breaker", key, value)
    }

    fn write(&self, out: &mut String) {
        out.push_str("\n[[route]]\n");
        writeln!(out, "name = {}", quoted(&self.name)).unwrap();
        writeln!(out, "topics = {}", array(&self.topics)).unwrap();
        writeln!(out, "handler = {}", quoted(&self.handler)).unwrap();
        self.keys.write(out);
        for (table, keys) in &self.tables {
            keys.write_table(&format!("route.{table}"), out);
        }
    }

    /// This route alone in a config file on the test broker, for a test of
    /// it.
    pub fn test_route(self) -> TestRoute {
        ConfigBuilder::new().route(self).test_route()
    }
}

/// The `[delay]` table. Empty, the relay runs with every default.
#[derive(Debug, Clone, Default)]
pub struct DelayTable {
    keys: Keys,
}

impl DelayTable {
    /// A relay whose inbox and consumer group are both `name`: one no
    /// other test's relay shares.
    pub fn named(name: &str) -> DelayTable {
        DelayTable::default().inbox(name).group(name)
    }

    /// Any key of the relay, its value as TOML.
    pub fn key(mut self, key: &str, value: impl Display) -> Self {
        self.keys.set(key, value.to_string());
        self
    }

    pub fn inbox(self, topic: &str) -> Self {
        self.key("inbox", quoted(topic))
    }

    pub fn group(self, group: &str) -> Self {
        self.key("group", quoted(group))
    }

    pub fn tiers(self, tiers: &[&str]) -> Self {
        self.key("tiers", array(tiers))
    }

    pub fn max_delay(self, delay: &str) -> Self {
        self.key("max_delay", quoted(delay))
    }

    /// `targets`: the topics the relay may deliver to.
    pub fn targets(self, targets: &[impl Display]) -> Self {
        self.key("targets", array(targets))
    }
}

/// The `[admin]` table.
#[derive(Debug, Clone, Default)]
pub struct AdminTable {
    keys: Keys,
}

impl AdminTable {
    /// The admin server on a free loopback port.
    pub fn loopback() -> AdminTable {
        AdminTable::listen("127.0.0.1:0")
    }

    /// The admin server on `address`.
    pub fn listen(address: impl Display) -> AdminTable {
        let mut keys = Keys::default();
        keys.set("listen", quoted(address));
        AdminTable { keys }
    }

    /// The bearer token the admin API asks for.
    pub fn token(mut self, token: &str) -> Self {
        self.keys.set("token", quoted(token));
        self
    }

    /// Lets `POST /api/dlq/try` run an uploaded candidate.
    pub fn allow_code_upload(mut self) -> Self {
        self.keys.set("allow_code_upload", "true".into());
        self
    }

    /// Serves `/metrics`.
    pub fn metrics(mut self) -> Self {
        self.keys.set("metrics", "true".into());
        self
    }
}
