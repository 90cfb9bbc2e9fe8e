//! `[route.breaker]`: a route's circuit breaker (host/src/breaker.rs), off
//! unless the table is present.

use serde::Deserialize;
use std::time::Duration;

/// `[route.breaker]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Share of retryable verdicts, over the last `window` calls, at or
    /// above which the breaker opens. Default 0.5.
    #[serde(default = "default_rate")]
    pub retryable_rate: f64,
    /// Calls the window must hold before the breaker may open. Default 10.
    #[serde(default = "default_min_calls")]
    pub min_calls: u32,
    /// How many of the route's last calls the rate is taken over. Default 20.
    #[serde(default = "default_window")]
    pub window: u32,
    /// How long the breaker stays open before it lets probes through.
    /// Default 30s.
    #[serde(default = "default_cool_down", with = "humantime_serde")]
    pub cool_down: Duration,
    /// The cool-down doubles each time a probe fails, up to this. Default
    /// ten times `cool_down`.
    #[serde(default, with = "humantime_serde")]
    pub max_cool_down: Option<Duration>,
    /// Messages a half-open breaker lets through; it closes when none of
    /// them is retryable. Default 1.
    #[serde(default = "default_probes")]
    pub probes: u32,
    /// Pause the route's input topics too while open. Default false: new
    /// messages are still handled, and those that fail wait in the first
    /// tier.
    #[serde(default)]
    pub pause_input: bool,
}

fn default_rate() -> f64 {
    0.5
}
fn default_min_calls() -> u32 {
    10
}
fn default_window() -> u32 {
    20
}
fn default_cool_down() -> Duration {
    Duration::from_secs(30)
}
fn default_probes() -> u32 {
    1
}

/// Largest `window`: the window is a ring of this many flags per route.
pub const MAX_WINDOW: u32 = 10_000;
/// Largest `probes`.
pub const MAX_PROBES: u32 = 1_000;
/// Largest `cool_down` and `max_cool_down`: a day.
pub const MAX_COOL_DOWN: Duration = Duration::from_secs(24 * 60 * 60);

/// A route's breaker, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    pub retryable_rate: f64,
    pub min_calls: u32,
    pub window: u32,
    pub cool_down: Duration,
    pub max_cool_down: Duration,
    pub probes: u32,
    pub pause_input: bool,
}

impl BreakerConfig {
    /// Checks every key, pushing one problem per bad key, each naming it.
    pub(super) fn resolve(&self, label: &str, problems: &mut Vec<String>) -> BreakerSettings {
        let key = |name: &str| format!("{label}: breaker.{name}");
        if !(self.retryable_rate > 0.0 && self.retryable_rate <= 1.0) {
            problems.push(format!(
                "{} must be more than 0 and at most 1, not {}",
                key("retryable_rate"),
                self.retryable_rate
            ));
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            problems.push(format!(
                "{} must be between 1 and {MAX_WINDOW}, not {}",
                key("window"),
                self.window
            ));
        }
        if self.min_calls == 0 || self.min_calls > self.window {
            problems.push(format!(
                "{} must be between 1 and `window` ({}), not {}",
                key("min_calls"),
                self.window,
                self.min_calls
            ));
        }
        let human = |d: Duration| humantime::format_duration(d).to_string();
        if self.cool_down.is_zero() || self.cool_down > MAX_COOL_DOWN {
            problems.push(format!(
                "{} must be more than 0s and at most {}, not {}",
                key("cool_down"),
                human(MAX_COOL_DOWN),
                human(self.cool_down)
            ));
        }
        let max_cool_down = self
            .max_cool_down
            .unwrap_or_else(|| (self.cool_down * 10).min(MAX_COOL_DOWN));
        if self.max_cool_down.is_some()
            && (max_cool_down < self.cool_down || max_cool_down > MAX_COOL_DOWN)
        {
            problems.push(format!(
                "{} must be at least `cool_down` ({}) and at most {}, not {}",
                key("max_cool_down"),
                human(self.cool_down),
                human(MAX_COOL_DOWN),
                human(max_cool_down)
            ));
        }
        if !(1..=MAX_PROBES).contains(&self.probes) {
            problems.push(format!(
                "{} must be between 1 and {MAX_PROBES}, not {}",
                key("probes"),
                self.probes
            ));
        }
        BreakerSettings {
            retryable_rate: self.retryable_rate,
            min_calls: self.min_calls,
            window: self.window,
            cool_down: self.cool_down,
            max_cool_down,
            probes: self.probes,
            pause_input: self.pause_input,
        }
    }
}

#[cfg(test)]
mod tests {
    fn resolve(table: &str) -> Result<Option<super::BreakerSettings>, Vec<String>> {
        let text = crate::config::orders_text(table);
        crate::config::resolve_with_handler(&text).map(|mut c| c.routes.remove(0).breaker)
    }

    #[test]
    fn off_unless_the_table_is_there_and_defaults_fill_the_rest() {
        assert_eq!(resolve("").unwrap(), None);
        let settings = resolve("[route.breaker]\ncool_down = \"5s\"")
            .unwrap()
            .unwrap();
        assert_eq!(settings.retryable_rate, 0.5);
        assert_eq!((settings.min_calls, settings.window), (10, 20));
        assert_eq!(settings.max_cool_down, std::time::Duration::from_secs(50));
        assert_eq!(settings.probes, 1);
        assert!(!settings.pause_input);
    }

    #[test]
    fn every_bad_key_is_named() {
        let problems = resolve(
            "[route.breaker]\nretryable_rate = 1.5\nwindow = 5\nmin_calls = 6\ncool_down = \"0s\"\nprobes = 0",
        )
        .unwrap_err();
        let text = problems.join("\n");
        for key in [
            "route `orders`: breaker.retryable_rate must be more than 0 and at most 1, not 1.5",
            "route `orders`: breaker.min_calls must be between 1 and `window` (5), not 6",
            "route `orders`: breaker.cool_down must be more than 0s",
            "route `orders`: breaker.probes must be between 1 and 1000, not 0",
        ] {
            assert!(text.contains(key), "{key} missing from:\n{text}");
        }
        let problems =
            resolve("[route.breaker]\ncool_down = \"1m\"\nmax_cool_down = \"30s\"").unwrap_err();
        assert!(
            problems[0].contains("breaker.max_cool_down must be at least `cool_down` (1m)"),
            "{problems:?}"
        );
        let unknown = resolve("[route.breaker]\nthreshold = 0.5").unwrap_err();
        assert!(
            unknown[0].contains("unknown field `threshold`"),
            "{unknown:?}"
        );
        let single = resolve("max_attempts = 1\n[route.breaker]").unwrap_err();
        assert!(
            single[0].contains("breaker has nothing to pause: max_attempts is 1"),
            "{single:?}"
        );
        assert!(resolve("max_attempts = 1\n[route.breaker]\npause_input = true").is_ok());
        let nan = resolve("[route.breaker]\nretryable_rate = nan").unwrap_err();
        assert!(nan[0].contains("breaker.retryable_rate"), "{nan:?}");
    }
}
