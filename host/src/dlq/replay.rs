//! Replay: selected dead-letter records go back to their route's input
//! (the delay relay's go back to its inbox), with attempts reset, their id,
//! origin and trail kept, `replay` added to the trail and the replay counted
//! in `hopper-replay-count`.
//!
//! The dead-letter topic is never changed. Each replay is recorded in the
//! topic's replay journal (`<dlq>.replays`), before it is produced, so a
//! list shows how often each record was replayed and a stopped replay can
//! be resumed without replaying any record twice ([`super::run`]). A record whose message was replayed
//! `replay.max_replays` times already (counting its earlier lineage and the
//! journal) is not replayed again: a copy goes to the dead-letter topic with
//! reason REPLAY_LOOP instead. Records are replayed in batches of at most
//! [`MAX_BATCH`], each paced by a [`Pacer`], and a dry run plans everything
//! and produces nothing.

use super::browse::{Dlq, DlqError, replay_counts};
use super::record::{RecordRef, envelope_of};
use super::run::{self, RunId};
use super::{Plan, plan as dead_letter};
use crate::clock::now_ms;
use crate::config::{OwnedKind, OwnedTopics, RELAY_ROUTE, owners_text, replay_journal};
use crate::headers::{self, Envelope, Reason};
use crate::kafka::WatchedContext;
use crate::lag;
use crate::renewable::AwaitedProducer;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long one produce may take before the replay of that record fails.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a replay does with one record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ReplayAction {
    /// Produce it to `to` as replay number `replay` of its message.
    Replay { to: String, replay: u32 },
    /// Past the loop guard: a copy goes to its DLQ with REPLAY_LOOP.
    Loop { to: String, replays: u32 },
    /// Leave it, for `problem`.
    Skip { problem: String },
}

/// One record's replay, planned or done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayOutcome {
    pub at: RecordRef,
    pub id: Option<String>,
    pub route: Option<String>,
    #[serde(flatten)]
    pub action: ReplayAction,
    /// Set when the produce failed; the record was then not replayed.
    pub failed: Option<String>,
}

/// What a replay did, record by record; for a dry run, what it would do.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub dry_run: bool,
    /// The run's id: resume it with it ([`super::run`]).
    pub run: Option<String>,
    pub replayed: usize,
    pub looped: usize,
    pub skipped: usize,
    pub failed: usize,
    /// Skipped by a resumed run: it replayed them before.
    pub already: usize,
    pub outcomes: Vec<ReplayOutcome>,
}

/// Spaces produces evenly at a rate; shared by concurrent replays.
pub struct Pacer {
    interval: Duration,
    // std Mutex: held to take a slot, never across an .await.
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    /// At most `per_second` produces a second (at least 1).
    pub fn new(per_second: u32) -> Pacer {
        Pacer {
            interval: Duration::from_secs(1) / per_second.max(1),
            next: Mutex::new(None),
        }
    }

    /// Records a replay takes in one batch: a tenth of a second's worth at
    /// the rate, at least 1 and at most [`MAX_BATCH`].
    pub fn batch(&self) -> usize {
        let per_tenth = Duration::from_millis(100).as_nanos() / self.interval.as_nanos().max(1);
        (per_tenth as usize).clamp(1, MAX_BATCH)
    }

    /// Waits for the next slot.
    pub async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().unwrap();
            let now = Instant::now();
            let at = next.map_or(now, |n| n.max(now));
            *next = Some(at + self.interval);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// A record, and what to do with it.
struct Planned {
    message: OwnedMessage,
    envelope: Option<Envelope>,
    keep: &'static [&'static str],
    outcome: ReplayOutcome,
}

/// Headers of the delay relay's records that a replay keeps, so the relay
/// can schedule them again.
const RELAY_KEEP: &[&str] = &[headers::TARGET, headers::DELIVER_AT, headers::DELAY];

impl Dlq<'_> {
    /// What replaying `message`, replayed `replayed` times by the journal,
    /// would do, with `max_replays` as the loop guard.
    fn plan_one(
        &self,
        owned: &OwnedTopics,
        message: OwnedMessage,
        replayed: u32,
        max_replays: u32,
    ) -> Planned {
        let at = RecordRef {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
        };
        let route = headers::text(message.headers(), headers::ROUTE)
            .ok()
            .flatten()
            .map(str::to_string);
        let envelope = envelope_of(&message);
        let id = envelope.as_ref().ok().map(|e| e.id.clone());
        let (action, keep) = match (&envelope, route.as_deref()) {
            (Err(e), _) => (
                skip(format!("not a hopper dead-letter record: {e}")),
                &[][..],
            ),
            (_, None) => (
                skip(format!("header {} is missing", headers::ROUTE)),
                &[][..],
            ),
            (Ok(envelope), Some(route)) => {
                match self.input_of(owned, &at.topic, route, &envelope.origin.topic, &message) {
                    Err(problem) => (skip(problem), &[][..]),
                    Ok((to, keep)) => {
                        // Saturating: `replays` comes from a header, and a
                        // count that large is past any loop guard.
                        let replay = envelope.replays.saturating_add(replayed).saturating_add(1);
                        if replay > max_replays {
                            let replays = replay - 1;
                            (
                                ReplayAction::Loop {
                                    to: at.topic.clone(),
                                    replays,
                                },
                                keep,
                            )
                        } else {
                            (ReplayAction::Replay { to, replay }, keep)
                        }
                    }
                }
            }
        };
        Planned {
            envelope: envelope.ok(),
            keep,
            outcome: ReplayOutcome {
                at,
                id,
                route,
                action,
                failed: None,
            },
            message,
        }
    }

    /// Where a record read from dead-letter topic `dlq`, whose headers name
    /// `route` and `origin`, goes back to: its origin topic, an input of
    /// the route that owns `dlq`; the relay inbox for the relay's records.
    ///
    /// Anyone who can write to a dead-letter topic can write any headers,
    /// so the headers only have to agree with where the record was read:
    /// the destination comes from the config, never from a header. A record
    /// whose `hopper-route` is not an owner of `dlq`, or whose origin is not
    /// one of that route's inputs, is skipped with the reason. So is a
    /// destination that is one of hopper's own topics (`owned`) but another
    /// route's dead-letter topic (a route may read one), and a relay's record
    /// whose `hopper-target` the relay would refuse.
    fn input_of(
        &self,
        owned: &OwnedTopics,
        dlq: &str,
        route: &str,
        origin: &str,
        message: &OwnedMessage,
    ) -> Result<(String, &'static [&'static str]), String> {
        let relay = self.config.delay.as_ref().filter(|relay| relay.dlq == dlq);
        let owners: Vec<&str> = self
            .config
            .routes
            .iter()
            .filter(|r| r.dlq == dlq)
            .map(|r| r.name.as_str())
            .chain(relay.map(|_| RELAY_ROUTE))
            .collect();
        if owners.is_empty() {
            return Err(format!(
                "`{dlq}` is not the dead-letter topic of any route in the config"
            ));
        }
        if !owners.contains(&route) {
            return Err(format!(
                "header {} names `{}`, but `{dlq}` is the dead-letter topic of {}",
                headers::ROUTE,
                headers::shorten(route, 64),
                owners
                    .iter()
                    .map(|o| match *o {
                        RELAY_ROUTE => "the delay relay".to_string(),
                        name => format!("route `{name}`"),
                    })
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
        if let Some(relay) = relay.filter(|_| route == RELAY_ROUTE) {
            // The relay schedules the record again: its target must be one
            // the relay would forward to, or the replay would write, with
            // hopper's credentials, where no producer may.
            let target = headers::text(message.headers(), headers::TARGET)
                .map_err(|e| format!("header {}: {e}", headers::TARGET))?
                .ok_or_else(|| format!("header {} is missing", headers::TARGET))?;
            relay
                .check_target(target)
                .map_err(|why| format!("header {}: {why}", headers::TARGET))?;
            return Ok((relay.inbox.clone(), RELAY_KEEP));
        }
        let owner = self
            .config
            .routes
            .iter()
            .find(|r| r.name == route && r.dlq == dlq)
            .expect("`route` is one of the owners");
        if let Some(own) = owned
            .get(origin)
            .filter(|own| own.kind != OwnedKind::DeadLetter)
        {
            Err(format!(
                "header {} names `{}`, hopper's own {} ({}), which a replay never writes",
                headers::ORIGIN_TOPIC,
                headers::shorten(origin, 256),
                own.kind.name(),
                owners_text(&own.owners)
            ))
        } else if owner.topics.iter().any(|t| t == origin) {
            Ok((origin.to_string(), &[]))
        } else {
            Err(format!(
                "header {} names `{}`, which is not an input of route `{route}` ({})",
                headers::ORIGIN_TOPIC,
                headers::shorten(origin, 256),
                owner.topics.join(", ")
            ))
        }
    }

    /// Replays `messages` (dead-letter records of this config) as run
    /// `run`: plans each, and unless `dry_run`, produces them in batches
    /// ([`Replayer::batch`]) at `pacer`'s rate, calling `done` after each.
    /// Each replay is a span of `tracer`'s. A run stopped part way (its
    /// process killed) is finished by `hopper dlq replay --resume RUN` with
    /// the same selection.
    #[allow(clippy::too_many_arguments)]
    pub async fn replay(
        &self,
        run: RunId,
        messages: Vec<OwnedMessage>,
        max_replays: u32,
        dry_run: bool,
        pacer: &Pacer,
        tracer: &crate::trace::Tracer,
        mut done: impl FnMut(&ReplayOutcome),
    ) -> Result<ReplayReport, DlqError> {
        let mut replayer = Replayer::new(self, run, max_replays, dry_run, pacer, tracer)?;
        let mut journals = HashMap::new();
        let mut report = replayer.report();
        let size = pacer.batch();
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let mut items = Vec::with_capacity(size);
            for message in messages.by_ref().take(size) {
                let topic = message.topic().to_string();
                if !journals.contains_key(&topic) {
                    journals.insert(topic.clone(), replay_counts(self.cluster, &topic)?);
                }
                let at = RecordRef {
                    topic,
                    partition: message.partition(),
                    offset: message.offset(),
                };
                let replayed = journals[&at.topic].get(&at).copied().unwrap_or(0);
                items.push(Item {
                    message,
                    replayed,
                    redo: false,
                });
            }
            for outcome in replayer.batch(items).await {
                report.count(&outcome);
                done(&outcome);
                report.outcomes.push(outcome);
            }
        }
        Ok(report)
    }
}

/// How long a destination's end offsets, read for a journal entry, are
/// used before they are read again. Older ones are still a lower bound of
/// where the replay lands, only further back.
const ENDS_FRESH: Duration = Duration::from_secs(1);

/// The most records a replay takes in one batch: what a crash can leave
/// recorded in the journal but not replayed, for a resume to check.
pub const MAX_BATCH: usize = 500;

/// One record for [`Replayer::batch`].
pub struct Item {
    pub message: OwnedMessage,
    /// How often the journal says it was replayed, not counting this run.
    pub replayed: u32,
    /// The run has an entry for it whose replay was not produced.
    pub redo: bool,
}

/// A journal entry, ready to produce.
struct JournalEntry {
    journal: String,
    key: String,
    headers: OwnedHeaders,
}

/// One run's replays, batch by batch. All of a batch's journal entries
/// are written, and acknowledged, before any of its replays is produced,
/// and the next batch's entries only once all its replays are
/// acknowledged ([`super::run`] says why, and how a resume finds the
/// batch that may lack its replays).
pub struct Replayer<'a> {
    dlq: &'a Dlq<'a>,
    owned: OwnedTopics,
    max_replays: u32,
    pacer: &'a Pacer,
    tracer: &'a crate::trace::Tracer,
    /// `None` for a dry run.
    producer: Option<AwaitedProducer>,
    /// Reads destinations' end offsets; `None` for a dry run.
    reader: Option<BaseConsumer<WatchedContext>>,
    run: RunId,
    /// This process's attempt of the run; a new one after each failure, so
    /// that only an attempt's last batch can lack replays.
    attempt: String,
    /// Entries the attempt wrote.
    written: u64,
    /// Each destination's end offsets (as [`run::AFTER`] holds them), and
    /// when they were read.
    ends: HashMap<String, (Instant, String)>,
}

impl<'a> Replayer<'a> {
    pub fn new(
        dlq: &'a Dlq<'a>,
        run: RunId,
        max_replays: u32,
        dry_run: bool,
        pacer: &'a Pacer,
        tracer: &'a crate::trace::Tracer,
    ) -> Result<Replayer<'a>, DlqError> {
        let (producer, reader) = if dry_run {
            (None, None)
        } else {
            let mut config = dlq.cluster.producer_config();
            // A batch's entries, then its replays, are sent together and
            // awaited together: a few ms of linger puts each into a few
            // large produce requests rather than one request a record.
            config.set("linger.ms", "5");
            let producer = AwaitedProducer::new(config, "a DLQ replay")
                .map_err(|e| DlqError::Producer(format!("{e:#}")))?;
            let reader = super::browse::reader(dlq.cluster, "a replay's destination")?;
            (Some(producer), Some(reader))
        };
        Ok(Replayer {
            owned: dlq.config.owned(),
            dlq,
            max_replays,
            pacer,
            tracer,
            producer,
            reader,
            run,
            attempt: attempt_id(),
            written: 0,
            ends: HashMap::new(),
        })
    }

    /// An empty report of this run.
    pub fn report(&self) -> ReplayReport {
        ReplayReport {
            dry_run: self.producer.is_none(),
            run: Some(self.run.to_string()),
            ..ReplayReport::default()
        }
    }

    /// Plans each of `items` (at most [`MAX_BATCH`]), and unless this is a
    /// dry run, replays them (or copies them back with REPLAY_LOOP) as one
    /// batch: writes all their journal entries and awaits them, then
    /// produces, at the pacer's rate, the replays of those whose entry was
    /// acknowledged, and awaits them. Their outcomes, in order. After any
    /// failure the next batch starts a new attempt.
    pub async fn batch(&mut self, items: Vec<Item>) -> Vec<ReplayOutcome> {
        let mut planned: Vec<(Planned, bool)> = items
            .into_iter()
            .map(|item| {
                let p =
                    self.dlq
                        .plan_one(&self.owned, item.message, item.replayed, self.max_replays);
                (p, item.redo)
            })
            .collect();
        if self.producer.is_some() {
            self.produce(&mut planned).await;
        }
        planned.into_iter().map(|(p, _)| p.outcome).collect()
    }

    async fn produce(&mut self, planned: &mut [(Planned, bool)]) {
        let first = self.written;
        let mut entries = Vec::new();
        for (i, (p, redo)) in planned.iter_mut().enumerate() {
            let Some(envelope) = &p.envelope else {
                continue;
            };
            if matches!(p.outcome.action, ReplayAction::Skip { .. }) {
                continue;
            }
            match self.entry(envelope, &p.outcome, *redo, first) {
                Ok(entry) => entries.push((i, entry)),
                Err(e) => p.outcome.failed = Some(e),
            }
        }
        let producer = self.producer.as_ref().expect("not a dry run");
        // Every entry, then every replay whose entry is acknowledged.
        let acks = futures::future::join_all(entries.into_iter().map(|(i, entry)| async move {
            let JournalEntry {
                journal,
                key,
                headers,
            } = entry;
            let sent = send(producer, &journal, Some(key.as_bytes()), None, headers)
                .await
                .map_err(|e| format!("not replayed: cannot record it in `{journal}`: {e}"));
            (i, sent)
        }))
        .await;
        let mut recorded = Vec::new();
        for (i, ack) in acks {
            match ack {
                Ok(()) => recorded.push(i),
                Err(e) => planned[i].0.outcome.failed = Some(e),
            }
        }
        let this = &*self;
        let replays = futures::future::join_all(recorded.into_iter().map(|i| {
            let p = &planned[i].0;
            async move {
                this.pacer.wait().await;
                (i, this.replay_one(producer, p).await)
            }
        }))
        .await;
        for (i, replayed) in replays {
            let p = &mut planned[i].0;
            match replayed {
                Err(e) => p.outcome.failed = Some(e),
                Ok(()) => {
                    if let (ReplayAction::Replay { to, replay }, Some(envelope)) =
                        (&p.outcome.action, &p.envelope)
                    {
                        let from = p.outcome.at.to_string();
                        crate::trace::export::replayed(
                            self.tracer,
                            &envelope.trace,
                            to,
                            &from,
                            *replay,
                        );
                    }
                }
            }
        }
        if planned.iter().any(|(p, _)| p.outcome.failed.is_some()) {
            self.attempt = attempt_id();
            self.written = 0;
        }
    }

    /// `topic`'s end offsets, read at most [`ENDS_FRESH`] ago.
    fn ends_of(&mut self, topic: &str) -> Result<String, String> {
        if let Some((at, text)) = self.ends.get(topic)
            && at.elapsed() < ENDS_FRESH
        {
            return Ok(text.clone());
        }
        let reader = self.reader.as_ref().expect("not a dry run");
        let read = Instant::now();
        let mut ends = Vec::new();
        let partitions = lag::partitions(reader, topic).map_err(|e| e.to_string())?;
        for p in partitions {
            let (_, high) = lag::watermarks(reader, topic, p).map_err(|e| e.to_string())?;
            ends.push((p, high));
        }
        let text = run::after_text(&ends);
        self.ends.insert(topic.to_string(), (read, text.clone()));
        Ok(text)
    }

    /// The journal entry of one planned replay, or of a REPLAY_LOOP copy,
    /// as the attempt's next entry, in the batch whose first entry is
    /// number `batch` of the attempt.
    fn entry(
        &mut self,
        envelope: &Envelope,
        outcome: &ReplayOutcome,
        redo: bool,
        batch: u64,
    ) -> Result<JournalEntry, String> {
        let (to, replay, kind, after) = match &outcome.action {
            ReplayAction::Skip { .. } => unreachable!("a skipped record has no entry"),
            ReplayAction::Replay { to, replay } => {
                let after = self
                    .ends_of(to)
                    .map_err(|e| format!("not replayed: cannot read the end of `{to}`: {e}"))?;
                (to, *replay, if redo { "redo" } else { "replay" }, after)
            }
            ReplayAction::Loop { to, replays } => (to, *replays, "loop", String::new()),
        };
        let attempt = format!("{}/{}", self.attempt, self.written);
        self.written += 1;
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: crate::traceparent::TRACEPARENT,
                value: Some(&envelope.trace.traceparent()),
            })
            .insert(text_header(headers::ID, &envelope.id))
            .insert(text_header(headers::REPLAY_COUNT, &replay.to_string()))
            .insert(text_header(run::REPLAYED_TO, to))
            .insert(text_header(run::RUN, self.run.as_str()))
            .insert(text_header(run::ATTEMPT, &attempt))
            .insert(text_header(run::BATCH, &batch.to_string()))
            .insert(text_header(run::ENTRY, kind))
            .insert(text_header(run::AFTER, &after));
        Ok(JournalEntry {
            journal: replay_journal(&outcome.at.topic),
            key: outcome.at.to_string(),
            headers,
        })
    }

    /// Produces one planned replay, whose journal entry is acknowledged;
    /// or a REPLAY_LOOP copy.
    async fn replay_one(&self, producer: &AwaitedProducer, p: &Planned) -> Result<(), String> {
        let Planned {
            message,
            envelope,
            keep,
            outcome,
        } = p;
        let envelope = envelope.as_ref().expect("a record with an entry");
        let at = outcome.at.to_string();
        match &outcome.action {
            ReplayAction::Skip { .. } => Ok(()),
            ReplayAction::Replay { to, replay } => {
                let headers =
                    headers::replay_headers(message.headers(), envelope, *replay, &at, keep)
                        .insert(text_header(run::RUN, self.run.as_str()));
                send(producer, to, message.key(), message.payload(), headers)
                    .await
                    .map_err(|e| {
                        format!(
                            "recorded in `{}` but maybe not replayed: {e}; resume run {} to replay it if it was not",
                            replay_journal(&outcome.at.topic),
                            self.run
                        )
                    })
            }
            ReplayAction::Loop { to, replays } => {
                let route = outcome.route.as_deref().unwrap_or_default();
                let envelope = Envelope {
                    replays: *replays,
                    ..envelope.clone()
                };
                let error = format!(
                    "replayed {replays} time(s) already; replay.max_replays allows no more"
                );
                let hop = dead_letter(
                    message,
                    Plan {
                        topic: to,
                        route,
                        envelope: &envelope,
                        attempts_made: envelope.attempts_made,
                        reason: Reason::ReplayLoop,
                        error: &error,
                        handler: None,
                        keep,
                    },
                );
                let record = hop.record;
                send(
                    producer,
                    &record.topic,
                    record.key.as_deref(),
                    record.payload.as_deref(),
                    record.headers,
                )
                .await
            }
        }
    }
}

/// A new attempt's id, random.
fn attempt_id() -> String {
    format!("{:012x}", fastrand::u64(..) >> 16)
}

impl ReplayReport {
    /// Counts `outcome` in.
    pub fn count(&mut self, outcome: &ReplayOutcome) {
        match (&outcome.action, &outcome.failed) {
            (_, Some(_)) => self.failed += 1,
            (ReplayAction::Replay { .. }, None) => self.replayed += 1,
            (ReplayAction::Loop { .. }, None) => self.looped += 1,
            (ReplayAction::Skip { .. }, None) => self.skipped += 1,
        }
    }
}

fn skip(problem: String) -> ReplayAction {
    ReplayAction::Skip { problem }
}

fn text_header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

async fn send(
    producer: &AwaitedProducer,
    topic: &str,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: OwnedHeaders,
) -> Result<(), String> {
    let mut record = FutureRecord::<[u8], [u8]>::to(topic)
        .headers(headers)
        .timestamp(now_ms());
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(payload) = payload {
        record = record.payload(payload);
    }
    producer
        .send(record, PRODUCE_TIMEOUT)
        .await
        .map(|_| ())
        .map_err(|e| format!("cannot produce to `{topic}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_spaces_produces_at_its_rate() {
        let pacer = Pacer::new(10);
        let start = Instant::now();
        for _ in 0..21 {
            pacer.wait().await;
        }
        // The first goes at once, then one every 100 ms.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pacer_is_shared_by_concurrent_replays() {
        let pacer = std::sync::Arc::new(Pacer::new(4));
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let pacer = pacer.clone();
                tokio::spawn(async move {
                    for _ in 0..4 {
                        pacer.wait().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_millis(1750));
    }
}
