//! A route's circuit breaker: when its handler answers `retryable` too often
//! (the service it calls is down), the route stops taking messages out of
//! its retry tiers for a cool-down instead of spending their attempts, then
//! lets a few probes through to see whether the service is back.
//!
//! ```text
//!            rate ≥ retryable_rate            cool-down over
//!  Closed ───────────────────────────► Open ───────────────────► HalfOpen
//!    ▲      (over the last `window`     ▲                           │
//!    │       calls, ≥ `min_calls`)      │  a probe is retryable     │
//!    │                                  └───────────────────────────┤
//!    │            `probes` probes are not retryable                 │
//!    └──────────────────────────────────────────────────────────────┘
//! ```
//!
//! - **The window counts calls, not time**: the last `window` verdicts of
//!   the route, whatever their age. A route's rate varies by orders of
//!   magnitude between day and night; a count makes `min_calls` and the
//!   rate mean the same at both. Calls made while the breaker is not closed
//!   do not enter it, and it starts empty after every close.
//! - **The cool-down doubles** each time a half-open breaker reopens, up to
//!   `max_cool_down`, and goes back to `cool_down` when the breaker closes:
//!   a long outage is probed less and less often, a short one is noticed
//!   quickly.
//! - **Probes are real deliveries.** A half-open breaker admits `probes`
//!   messages to the handler; their verdicts are routed as usual (a failed
//!   probe goes up the ladder and uses an attempt), so a poison message
//!   cannot keep the breaker open forever.
//! - **Everything else from a tier waits.** While the breaker is open, and
//!   while a half-open breaker waits for its probes' verdicts, a tier
//!   message that still reaches the route (it was fetched before the pause
//!   took effect) is not handed to the handler: [`Admit::Defer`] sends it
//!   back to its tier with its attempts unchanged.
//!
//! Time is passed in (epoch ms), so the state machine is tested without a
//! clock. The state is behind a std `Mutex`, never held across an `.await`;
//! a route without a breaker never touches one.

use crate::config::BreakerSettings;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// What a route does with a message, as the breaker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Call the handler; report the verdict with [`Breaker::record`].
    Call,
    /// Call the handler as probe number `round` of a half-open breaker;
    /// report the verdict with [`Breaker::record`].
    Probe { round: u64 },
    /// Do not call the handler: send the message back to its tier with its
    /// attempts unchanged.
    Defer,
}

/// Which of the route's topics must not be consumed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspended {
    None,
    /// The retry tiers.
    Tiers,
    /// The retry tiers and the input topics (`pause_input = true`).
    TiersAndInput,
}

/// The state, as reported to health, the admin API and `hopper status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    /// Open until `until_ms` (epoch ms).
    Open {
        until_ms: i64,
        cool_down_ms: u64,
    },
    /// Letting `probes` messages through; `admitted` of them so far.
    HalfOpen {
        probes: u32,
        admitted: u32,
    },
}

impl BreakerState {
    /// The `hopper_breaker_state` gauge: 0 closed, 1 open, 2 half-open.
    pub fn gauge(&self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open { .. } => 1,
            BreakerState::HalfOpen { .. } => 2,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half-open",
        }
    }
}

/// A change of state, for the caller to log, count and report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Closed → open: `retryable` of the last `calls` calls were retryable.
    Opened {
        retryable: u32,
        calls: u32,
        cool_down: Duration,
    },
    /// Half-open → open: a probe was retryable.
    Reopened { cool_down: Duration },
    /// Open → half-open: the cool-down is over.
    HalfOpened { probes: u32 },
    /// Half-open → closed: every probe was not retryable.
    Closed { open_for: Duration },
}

#[derive(Debug)]
enum State {
    Closed,
    Open {
        until_ms: i64,
    },
    HalfOpen {
        /// Which half-open period this is; a probe's verdict that arrives
        /// after its period ended is ignored.
        round: u64,
        admitted: u32,
        passed: u32,
    },
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// The last `window` verdicts while closed: `true` for retryable.
    window: VecDeque<bool>,
    retryable: u32,
    /// The cool-down of the next reopening.
    cool_down: Duration,
    /// When the breaker last opened from closed, for `open_for`.
    opened_at_ms: i64,
    round: u64,
}

/// One route's breaker.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        let inner = Inner {
            state: State::Closed,
            window: VecDeque::with_capacity(settings.window as usize),
            retryable: 0,
            cool_down: settings.cool_down,
            opened_at_ms: 0,
            round: 0,
        };
        Breaker {
            settings,
            inner: Mutex::new(inner),
        }
    }

    pub fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// What to do with a message about to be handled at `now_ms`, read from
    /// a retry tier or not. The transition is `HalfOpened` when the
    /// cool-down just ended.
    pub fn admit(&self, now_ms: i64, from_tier: bool) -> (Admit, Option<Transition>) {
        let mut inner = self.inner.lock().unwrap();
        let transition = inner.half_open_if_due(now_ms, &self.settings);
        let admit = match &mut inner.state {
            State::Closed => Admit::Call,
            State::HalfOpen {
                round, admitted, ..
            } if *admitted < self.settings.probes => {
                *admitted += 1;
                Admit::Probe { round: *round }
            }
            // Input messages are paused only with `pause_input`; those that
            // still come are handled, and a failure only moves them to the
            // first tier, where they wait.
            State::Open { .. } | State::HalfOpen { .. } if !from_tier => Admit::Call,
            State::Open { .. } | State::HalfOpen { .. } => Admit::Defer,
        };
        (admit, transition)
    }

    /// Reports the verdict of a call [`Breaker::admit`] allowed:
    /// `retryable` when it was `retryable`, or a failure the route retries
    /// (a timeout, a trap under `on_trap = "retry"`).
    pub fn record(&self, admit: Admit, retryable: bool, now_ms: i64) -> Option<Transition> {
        let mut guard = self.inner.lock().unwrap();
        let inner = &mut *guard;
        let settings = &self.settings;
        match (admit, &mut inner.state) {
            (Admit::Call, State::Closed) => {
                inner.window.push_back(retryable);
                inner.retryable += retryable as u32;
                if inner.window.len() > settings.window as usize
                    && inner.window.pop_front() == Some(true)
                {
                    inner.retryable -= 1;
                }
                let calls = inner.window.len() as u32;
                let rate = inner.retryable as f64 / calls as f64;
                if calls < settings.min_calls || rate < settings.retryable_rate {
                    return None;
                }
                let retryable = inner.retryable;
                inner.open(now_ms);
                inner.opened_at_ms = now_ms;
                Some(Transition::Opened {
                    retryable,
                    calls,
                    cool_down: settings.cool_down,
                })
            }
            (
                Admit::Probe { round },
                State::HalfOpen {
                    round: current,
                    passed,
                    ..
                },
            ) if round == *current => {
                if retryable {
                    inner.cool_down = (inner.cool_down * 2).min(settings.max_cool_down);
                    let cool_down = inner.cool_down;
                    inner.open(now_ms);
                    return Some(Transition::Reopened { cool_down });
                }
                *passed += 1;
                if *passed < settings.probes {
                    return None;
                }
                inner.state = State::Closed;
                inner.cool_down = settings.cool_down;
                let open_for = (now_ms - inner.opened_at_ms).max(0) as u64;
                Some(Transition::Closed {
                    open_for: Duration::from_millis(open_for),
                })
            }
            // A call that started before the state changed, a probe of an
            // earlier round, or a message handled while open: it says
            // nothing about the current state.
            _ => None,
        }
    }

    /// Which topics must stay paused at `now_ms`: the tiers (and the inputs
    /// with `pause_input`) while open, and while a half-open breaker has
    /// admitted all its probes and waits for their verdicts.
    pub fn suspended(&self, now_ms: i64) -> (Suspended, Option<Transition>) {
        let mut inner = self.inner.lock().unwrap();
        let transition = inner.half_open_if_due(now_ms, &self.settings);
        let paused = match inner.state {
            State::Closed => false,
            State::Open { .. } => true,
            State::HalfOpen { admitted, .. } => admitted >= self.settings.probes,
        };
        let suspended = match (paused, self.settings.pause_input) {
            (false, _) => Suspended::None,
            (true, false) => Suspended::Tiers,
            (true, true) => Suspended::TiersAndInput,
        };
        (suspended, transition)
    }

    /// The state now, without moving it on.
    pub fn state(&self) -> BreakerState {
        let inner = self.inner.lock().unwrap();
        match inner.state {
            State::Closed => BreakerState::Closed,
            State::Open { until_ms } => BreakerState::Open {
                until_ms,
                cool_down_ms: inner.cool_down.as_millis() as u64,
            },
            State::HalfOpen { admitted, .. } => BreakerState::HalfOpen {
                probes: self.settings.probes,
                admitted,
            },
        }
    }
}

impl Inner {
    fn open(&mut self, now_ms: i64) {
        let until_ms = now_ms.saturating_add(self.cool_down.as_millis() as i64);
        self.state = State::Open { until_ms };
        self.window.clear();
        self.retryable = 0;
    }

    fn half_open_if_due(&mut self, now_ms: i64, settings: &BreakerSettings) -> Option<Transition> {
        match self.state {
            State::Open { until_ms } if now_ms >= until_ms => {
                self.round += 1;
                self.state = State::HalfOpen {
                    round: self.round,
                    admitted: 0,
                    passed: 0,
                };
                Some(Transition::HalfOpened {
                    probes: settings.probes,
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            retryable_rate: 0.5,
            min_calls: 4,
            window: 6,
            cool_down: Duration::from_secs(10),
            max_cool_down: Duration::from_secs(35),
            probes: 2,
            pause_input: false,
        }
    }

    /// Feeds closed-state verdicts at `now`; returns the last transition.
    fn feed(breaker: &Breaker, verdicts: &[bool], now: i64) -> Option<Transition> {
        let mut last = None;
        for &retryable in verdicts {
            let (admit, _) = breaker.admit(now, false);
            assert_eq!(admit, Admit::Call);
            last = breaker.record(admit, retryable, now);
        }
        last
    }

    fn probe(breaker: &Breaker, now: i64) -> Admit {
        let (admit, _) = breaker.admit(now, true);
        assert!(matches!(admit, Admit::Probe { .. }), "{admit:?}");
        admit
    }

    #[test]
    fn does_not_open_before_min_calls_even_at_a_100_percent_rate() {
        let breaker = Breaker::new(settings());
        assert_eq!(feed(&breaker, &[true, true, true], 0), None);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(
            feed(&breaker, &[true], 0),
            Some(Transition::Opened {
                retryable: 4,
                calls: 4,
                cool_down: Duration::from_secs(10)
            })
        );
    }

    #[test]
    fn the_window_forgets_the_oldest_calls() {
        let breaker = Breaker::new(BreakerSettings {
            retryable_rate: 0.6,
            ..settings()
        });
        // 2 of 4, 5 and 6 are below the rate.
        assert_eq!(
            feed(&breaker, &[true, true, false, false, false, false], 0),
            None
        );
        // These two push the retryable ones out: 0 of 6.
        assert_eq!(feed(&breaker, &[false, false], 0), None);
        // 3 of 6 is below the rate; 4 of 6 opens (6 of 10 had the first
        // two still counted).
        assert_eq!(feed(&breaker, &[true, true, true], 0), None);
        assert!(matches!(
            feed(&breaker, &[true], 0),
            Some(Transition::Opened {
                retryable: 4,
                calls: 6,
                ..
            })
        ));
    }

    #[test]
    fn open_suspends_the_tiers_and_defers_tier_messages_until_the_cool_down_ends() {
        let breaker = Breaker::new(settings());
        feed(&breaker, &[true; 4], 1_000);
        assert_eq!(breaker.suspended(1_000).0, Suspended::Tiers);
        assert_eq!(breaker.admit(5_000, true).0, Admit::Defer);
        assert_eq!(breaker.admit(5_000, false).0, Admit::Call, "inputs flow");
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until_ms: 11_000,
                cool_down_ms: 10_000
            }
        );
        assert_eq!(breaker.suspended(10_999), (Suspended::Tiers, None));
        assert_eq!(
            breaker.suspended(11_000),
            (Suspended::None, Some(Transition::HalfOpened { probes: 2 }))
        );
    }

    #[test]
    fn pause_input_suspends_the_inputs_too() {
        let breaker = Breaker::new(BreakerSettings {
            pause_input: true,
            ..settings()
        });
        feed(&breaker, &[true; 4], 0);
        assert_eq!(breaker.suspended(0).0, Suspended::TiersAndInput);
    }

    #[test]
    fn half_open_admits_its_probes_then_waits_for_them() {
        let breaker = Breaker::new(settings());
        feed(&breaker, &[true; 4], 0);
        let (first, transition) = breaker.admit(10_000, true);
        assert_eq!(first, Admit::Probe { round: 1 });
        assert_eq!(transition, Some(Transition::HalfOpened { probes: 2 }));
        assert_eq!(breaker.suspended(10_000).0, Suspended::None);
        let second = probe(&breaker, 10_000);
        assert_eq!(breaker.admit(10_000, true).0, Admit::Defer);
        assert_eq!(
            breaker.suspended(10_000).0,
            Suspended::Tiers,
            "every probe is out: the tiers wait for their verdicts"
        );
        assert_eq!(breaker.record(first, false, 10_050), None);
        assert_eq!(
            breaker.record(second, false, 10_100),
            Some(Transition::Closed {
                open_for: Duration::from_millis(10_100)
            })
        );
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.suspended(10_100).0, Suspended::None);
        assert_eq!(
            feed(&breaker, &[true; 3], 10_200),
            None,
            "the window starts empty after a close"
        );
    }

    #[test]
    fn a_retryable_probe_reopens_with_a_doubled_cool_down_up_to_the_cap() {
        let breaker = Breaker::new(settings());
        feed(&breaker, &[true; 4], 0);
        let mut now = 0;
        for expected in [20, 35, 35] {
            now += 40_000;
            let admit = probe(&breaker, now);
            assert_eq!(
                breaker.record(admit, true, now),
                Some(Transition::Reopened {
                    cool_down: Duration::from_secs(expected)
                })
            );
            assert_eq!(breaker.suspended(now).0, Suspended::Tiers);
        }
        // Closing resets the cool-down.
        now += 40_000;
        let (a, b) = (probe(&breaker, now), probe(&breaker, now));
        breaker.record(a, false, now);
        breaker.record(b, false, now);
        assert!(matches!(
            feed(&breaker, &[true; 4], now),
            Some(Transition::Opened { cool_down, .. }) if cool_down == Duration::from_secs(10)
        ));
    }

    #[test]
    fn verdicts_from_an_earlier_state_are_ignored() {
        let breaker = Breaker::new(settings());
        // A call admitted while closed finishes after the breaker opened.
        let (late, _) = breaker.admit(0, false);
        feed(&breaker, &[true; 4], 0);
        assert_eq!(breaker.record(late, true, 1), None);
        // A probe of round 1 reports after round 1 reopened and round 2
        // began: round 2 decides alone.
        let (a, b) = (probe(&breaker, 10_000), probe(&breaker, 10_000));
        breaker.record(a, true, 10_000);
        let round2 = probe(&breaker, 40_000);
        assert_eq!(breaker.record(b, true, 40_000), None);
        assert_eq!(breaker.record(round2, false, 40_000), None);
        assert!(matches!(breaker.state(), BreakerState::HalfOpen { .. }));
    }

    #[test]
    fn fatal_verdicts_count_as_calls_but_not_as_retryable() {
        let breaker = Breaker::new(settings());
        // Half retryable at min_calls: exactly the rate opens it.
        assert!(feed(&breaker, &[false, true, false, true], 0).is_some());
    }
}
