//! An adaptive concurrency limit: the gradient rule.
//!
//! For an app without a fixed `containerConcurrency`, a limit can be found
//! from the app's own latency, as Envoy's adaptive concurrency filter
//! finds it. The rule is told, window by window, what the app took (the
//! mean latency of the requests that finished in the window) and compares
//! it with what the app takes unloaded:
//!
//! - **The unloaded latency** (`min`) is measured with the limit pinned
//!   low (`probe_limit`), over the windows it takes `probe_samples`
//!   requests to finish (their mean), at the start and again every
//!   `probe_every` windows: an app whose pace changes is measured anew,
//!   and a long overload cannot pass itself off as the unloaded pace.
//! - **Each window** between probes gives the app's latency under the
//!   limit (`now`). Then
//!
//!   ```text
//!   gradient = clamp(min × (1 + buffer) / now, 0.5, 2)
//!   target   = limit × gradient + √limit
//!   limit    = limit + smoothing × (target − limit), within [min_limit, max_limit]
//!   ```
//!
//!   The limit does not grow in a window where the app held less than half
//!   of it on average: an app not using its room says nothing of whether
//!   it could use more (Netflix's concurrency-limits holds the limit so).
//!
//! While the app keeps within `buffer` of its unloaded pace the limit
//! grows; once it slows under what it holds, the limit shrinks towards the
//! concurrency it serves without slowing, give or take the √limit of
//! headroom that lets the rule keep looking for more.
//!
//! [`Gradient`] is the rule alone, over numbers: no clock, no lock, no
//! breaker. [`Breaker::adaptive`](crate::Breaker::adaptive) applies it to
//! a breaker's capacity.

use std::time::Duration;

/// The gradient rule's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientSettings {
    /// The limit once the first probe is done, before the first window.
    pub initial: u32,
    /// The least limit.
    pub min_limit: u32,
    /// The greatest limit.
    pub max_limit: u32,
    /// How much slower than unloaded the app may get before the limit
    /// shrinks: 0.25 is a quarter slower.
    pub buffer: f64,
    /// How far each window moves the limit towards its target (0 to 1).
    pub smoothing: f64,
    /// The limit while the unloaded latency is measured.
    pub probe_limit: u32,
    /// How many finished requests a probe takes.
    pub probe_samples: u64,
    /// How many windows pass between probes.
    pub probe_every: u32,
}

impl Default for GradientSettings {
    /// Envoy's defaults where it has them: a limit of 3 while probing, 50
    /// samples, a 25% buffer, a limit of at most 1000.
    fn default() -> Self {
        Self {
            initial: 20,
            min_limit: 1,
            max_limit: 1000,
            buffer: 0.25,
            smoothing: 0.2,
            probe_limit: 3,
            probe_samples: 50,
            probe_every: 600,
        }
    }
}

/// What the app did in one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// The mean latency of the requests that finished in the window.
    pub latency: Duration,
    /// How many finished.
    pub finished: u64,
    /// How many requests the app held, on average over the window.
    pub held: f64,
}

/// What the rule is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring the unloaded latency: the seconds and the requests so far.
    Probing { seconds: f64, finished: u64 },
    /// Following the app, this many windows since the last probe.
    Following(u32),
}

impl Phase {
    const PROBE: Phase = Phase::Probing {
        seconds: 0.0,
        finished: 0,
    };
}

/// The gradient rule: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Gradient {
    settings: GradientSettings,
    /// The limit between probes.
    limit: f64,
    /// The unloaded latency, in seconds, once measured.
    min: Option<f64>,
    phase: Phase,
}

impl Gradient {
    /// The rule with `settings` (brought into range: limits of at least 1,
    /// the greatest at least the least, a smoothing within 0 and 1, at
    /// least one sample and one window); it starts with a probe.
    pub fn new(settings: GradientSettings) -> Self {
        let min_limit = settings.min_limit.max(1);
        let max_limit = settings.max_limit.max(min_limit);
        let settings = GradientSettings {
            min_limit,
            max_limit,
            buffer: settings.buffer.max(0.0),
            smoothing: settings.smoothing.clamp(0.0, 1.0),
            probe_limit: settings.probe_limit.clamp(min_limit, max_limit),
            probe_samples: settings.probe_samples.max(1),
            probe_every: settings.probe_every.max(1),
            ..settings
        };
        Self {
            limit: f64::from(settings.initial.clamp(min_limit, max_limit)),
            settings,
            min: None,
            phase: Phase::PROBE,
        }
    }

    /// The rule's settings, as brought into range.
    pub fn settings(&self) -> &GradientSettings {
        &self.settings
    }

    /// The limit to apply now: the probe's while probing.
    pub fn limit(&self) -> u32 {
        match self.phase {
            Phase::Probing { .. } => self.settings.probe_limit,
            // Within [min_limit, max_limit], both u32: no truncation.
            Phase::Following(_) => self.limit.round() as u32,
        }
    }

    /// Whether the rule is measuring the unloaded latency.
    pub fn probing(&self) -> bool {
        matches!(self.phase, Phase::Probing { .. })
    }

    /// The unloaded latency, once measured.
    pub fn unloaded(&self) -> Option<Duration> {
        self.min.map(Duration::from_secs_f64)
    }

    /// Takes in what the app did in a window; returns the limit to apply.
    ///
    /// While probing, the window's requests count towards the unloaded
    /// latency, and the probe ends with its last sample. While following,
    /// the window moves the limit, and the probe comes back once
    /// `probe_every` windows have passed. A window in which nothing
    /// finished says nothing and changes nothing.
    pub fn window(&mut self, window: Window) -> u32 {
        let now = window.latency.as_secs_f64();
        if window.finished == 0 || !now.is_finite() {
            return self.limit();
        }
        match &mut self.phase {
            Phase::Probing { seconds, finished } => {
                *seconds += now * window.finished as f64;
                *finished += window.finished;
                if *finished >= self.settings.probe_samples {
                    let mean = *seconds / *finished as f64;
                    // A zero latency says nothing: keep what was measured.
                    if mean > 0.0 {
                        self.min = Some(mean);
                    }
                    self.phase = Phase::Following(0);
                }
            }
            Phase::Following(windows) => {
                *windows += 1;
                let due = *windows >= self.settings.probe_every;
                if let Some(min) = self.min
                    && now > 0.0
                {
                    self.follow(min, now, window.held);
                }
                if due {
                    self.phase = Phase::PROBE;
                }
            }
        }
        self.limit()
    }

    /// One window's step towards the target.
    fn follow(&mut self, min: f64, now: f64, held: f64) {
        let limit = self.limit;
        let gradient = (min * (1.0 + self.settings.buffer) / now).clamp(0.5, 2.0);
        let mut target = limit * gradient + limit.sqrt();
        if target > limit && held < limit / 2.0 {
            // Room the app does not use: no reason to give it more.
            target = limit;
        }
        let next = limit + self.settings.smoothing * (target - limit);
        self.limit = next.clamp(
            f64::from(self.settings.min_limit),
            f64::from(self.settings.max_limit),
        );
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A window of `finished` requests at `latency` each, the app holding
    /// `held` on average.
    fn window(latency: Duration, finished: u64, held: f64) -> Window {
        Window {
            latency,
            finished,
            held,
        }
    }

    /// A rule that has measured an unloaded latency of `unloaded`.
    fn probed(settings: GradientSettings, unloaded: Duration) -> Gradient {
        let mut g = Gradient::new(settings);
        assert!(g.probing());
        assert_eq!(g.limit(), g.settings.probe_limit);
        g.window(window(unloaded, g.settings.probe_samples, 3.0));
        assert!(!g.probing());
        assert_eq!(g.unloaded(), Some(unloaded));
        g
    }

    #[test]
    fn the_probe_takes_the_mean_of_its_requests_then_the_limit_is_the_initial_one() {
        let mut g = Gradient::new(GradientSettings::default());
        assert_eq!(g.window(window(ms(10), 20, 3.0)), 3, "pinned while probing");
        assert_eq!(g.window(window(ms(1), 0, 0.0)), 3, "nothing finished");
        assert_eq!(
            g.window(window(ms(20), 30, 3.0)),
            20,
            "the window that brings the 50th sample ends the probe"
        );
        // (20 × 10 ms + 30 × 20 ms) / 50.
        assert_eq!(g.unloaded(), Some(ms(16)));
    }

    #[test]
    fn an_app_that_keeps_its_pace_gets_more_room_up_to_the_most() {
        let settings = GradientSettings {
            probe_every: u32::MAX,
            ..GradientSettings::default()
        };
        let mut g = probed(settings, ms(10));
        let mut last = g.limit();
        for _ in 0..100 {
            let limit = g.window(window(ms(10), 100, f64::from(last)));
            assert!(limit > last || limit == 1000, "{limit} ≤ {last}");
            last = limit;
        }
        assert_eq!(last, 1000);
    }

    #[test]
    fn room_the_app_does_not_use_is_not_grown() {
        let settings = GradientSettings {
            probe_every: u32::MAX,
            ..GradientSettings::default()
        };
        let mut g = probed(settings, ms(10));
        for _ in 0..100 {
            assert_eq!(g.window(window(ms(10), 100, 9.9)), 20);
        }
        assert!(
            g.window(window(ms(40), 100, 9.9)) < 20,
            "but it shrinks when the app slows"
        );
    }

    #[test]
    fn an_app_that_slows_with_what_it_holds_settles_where_it_keeps_its_pace() {
        // 10 ms unloaded, and 10 ms more for every 50 requests held past
        // the first 50.
        let latency = |held: u32| ms(10 * u64::from(held.max(50)) / 50);
        let settings = GradientSettings {
            initial: 500,
            probe_every: 100,
            ..GradientSettings::default()
        };
        let mut g = probed(settings, latency(3));
        let mut limit = g.limit();
        for _ in 0..2000 {
            limit = g.window(window(latency(limit), 100, f64::from(limit)));
        }
        // Probes keep finding 10 ms. Between them the rule settles where
        // the app is about `buffer` slower than that, less the √limit
        // headroom: min × 1.25 / now = 1 − 1/√limit, about 71 here.
        assert_eq!(g.unloaded(), Some(ms(10)));
        let settled = g.limit.round() as u32;
        assert!((60..=85).contains(&settled), "{settled}");
    }

    #[test]
    fn probes_come_back_every_so_many_windows() {
        let settings = GradientSettings {
            probe_every: 3,
            probe_samples: 2,
            ..GradientSettings::default()
        };
        let mut g = probed(settings, ms(10));
        let busy = |g: &Gradient| f64::from(g.limit());
        assert_eq!(g.window(window(ms(10), 5, busy(&g))), g.limit());
        g.window(window(ms(10), 5, busy(&g)));
        assert!(!g.probing());
        assert_eq!(
            g.window(window(ms(10), 5, busy(&g))),
            3,
            "the third window starts a probe"
        );
        assert!(g.probing());
        g.window(window(ms(20), 2, 3.0));
        assert_eq!(g.unloaded(), Some(ms(20)), "measured anew");
        assert!(g.limit() > 3);
    }

    #[test]
    fn settings_are_brought_into_range() {
        let g = Gradient::new(GradientSettings {
            initial: 0,
            min_limit: 0,
            max_limit: 0,
            buffer: -1.0,
            smoothing: 7.0,
            probe_limit: 9,
            probe_samples: 0,
            probe_every: 0,
        });
        assert_eq!(g.limit(), 1);
        assert_eq!(g.settings().probe_limit, 1);
        assert_eq!(g.settings().buffer, 0.0);
        assert_eq!(g.settings().smoothing, 1.0);
        assert_eq!(
            (g.settings().probe_samples, g.settings().probe_every),
            (1, 1)
        );
    }

    proptest! {
        /// Whatever the app's latencies, the limit stays within its
        /// bounds, and a window never moves it by more than its target
        /// allows: at most twice plus √limit up, at most half down.
        #[test]
        fn the_limit_stays_within_its_bounds_and_moves_by_steps(
            initial in 1u32..2000,
            min_limit in 1u32..50,
            max_limit in 1u32..2000,
            probe_every in 1u32..20,
            windows in prop::collection::vec((0u64..10_000_000, 0u64..20, 0.0f64..3000.0), 1..400),
        ) {
            let mut g = Gradient::new(GradientSettings {
                initial,
                min_limit,
                max_limit,
                probe_every,
                probe_samples: 3,
                ..GradientSettings::default()
            });
            let (lo, hi) = (g.settings.min_limit, g.settings.max_limit);
            for (micros, finished, held) in windows {
                let before = g.limit;
                let limit = g.window(window(Duration::from_micros(micros), finished, held));
                prop_assert!((lo..=hi).contains(&limit), "{} not in [{}, {}]", limit, lo, hi);
                prop_assert!(g.limit <= (2.0 * before + before.sqrt()).min(f64::from(hi)) + 1e-9);
                prop_assert!(g.limit >= (before * 0.5).max(f64::from(lo)) - 1e-9);
            }
        }
    }
}
