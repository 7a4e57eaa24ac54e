//! An adaptive concurrency limit: the gradient rule.
//!
//! For an app without a fixed `containerConcurrency`, a limit can be found
//! from the app's own latency, as Envoy's adaptive concurrency filter
//! finds it. The rule compares what the app takes now with what it takes
//! unloaded:
//!
//! - **The unloaded latency** (`min`) is measured with the limit pinned
//!   low (`probe_limit`), from the first `probe_samples` requests that
//!   finish then (their median), at the start and again every
//!   `probe_every` windows: an app whose pace changes is measured anew,
//!   and a long overload cannot pass itself off as the unloaded pace.
//! - **Each window** between probes gives the app's latency under the
//!   limit (`now`: the window's median, say). Then
//!
//!   ```text
//!   gradient = clamp(min × (1 + buffer) / now, 0.5, 2)
//!   target   = limit × gradient + √limit
//!   limit    = limit + smoothing × (target − limit), within [min_limit, max_limit]
//!   ```
//!
//! While the app keeps within `buffer` of its unloaded pace the limit
//! grows; once it slows under what it holds, the limit shrinks towards the
//! concurrency it serves without slowing, give or take the √limit of
//! headroom that lets the rule keep looking for more.
//!
//! [`Gradient`] is the rule alone, over numbers: no clock, no lock, no
//! breaker. Whoever samples the app applies the [`Gradient::limit`] it
//! gives (to a [`Breaker`](crate::Breaker)'s capacity, say).

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
    /// How many requests' latencies a probe takes.
    pub probe_samples: usize,
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

/// What the rule is doing.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Measuring the unloaded latency: the latencies so far.
    Probing(Vec<Duration>),
    /// Following the app, this many windows since the last probe.
    Following(u32),
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
            phase: Phase::Probing(Vec::new()),
        }
    }

    /// The limit to apply now: the probe's while probing.
    pub fn limit(&self) -> u32 {
        match self.phase {
            Phase::Probing(_) => self.settings.probe_limit,
            // Within [min_limit, max_limit], both u32: no truncation.
            Phase::Following(_) => self.limit.round() as u32,
        }
    }

    /// Whether the rule is measuring the unloaded latency: it wants each
    /// finished request's latency ([`Gradient::finished`]), not windows.
    pub fn probing(&self) -> bool {
        matches!(self.phase, Phase::Probing(_))
    }

    /// The unloaded latency, once measured.
    pub fn unloaded(&self) -> Option<Duration> {
        self.min.map(Duration::from_secs_f64)
    }

    /// A request finished after `latency`. While probing, it counts
    /// towards the unloaded latency; the probe ends with its last sample.
    /// Returns the limit to apply.
    pub fn finished(&mut self, latency: Duration) -> u32 {
        if let Phase::Probing(samples) = &mut self.phase {
            samples.push(latency);
            if samples.len() >= self.settings.probe_samples {
                samples.sort_unstable();
                let median = samples[samples.len() / 2].as_secs_f64();
                // A zero latency says nothing: keep what was measured.
                if median > 0.0 {
                    self.min = Some(median);
                }
                self.phase = Phase::Following(0);
            }
        }
        self.limit()
    }

    /// A window's latency while following (`now`); ignored while probing.
    /// Returns the limit to apply, which is the probe's once the windows
    /// between probes have passed.
    pub fn window(&mut self, now: Duration) -> u32 {
        let Phase::Following(windows) = &mut self.phase else {
            return self.limit();
        };
        *windows += 1;
        let due = *windows >= self.settings.probe_every;
        let now = now.as_secs_f64();
        if let Some(min) = self.min
            && now > 0.0
            && now.is_finite()
        {
            let gradient = (min * (1.0 + self.settings.buffer) / now).clamp(0.5, 2.0);
            let target = self.limit * gradient + self.limit.sqrt();
            let next = self.limit + self.settings.smoothing * (target - self.limit);
            self.limit = next.clamp(
                f64::from(self.settings.min_limit),
                f64::from(self.settings.max_limit),
            );
        }
        if due {
            self.phase = Phase::Probing(Vec::new());
        }
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A rule that has measured an unloaded latency of `unloaded`.
    fn probed(settings: GradientSettings, unloaded: Duration) -> Gradient {
        let mut g = Gradient::new(settings);
        assert!(g.probing());
        assert_eq!(g.limit(), g.settings.probe_limit);
        for _ in 0..g.settings.probe_samples {
            g.finished(unloaded);
        }
        assert!(!g.probing());
        assert_eq!(g.unloaded(), Some(unloaded));
        g
    }

    #[test]
    fn the_probe_takes_the_median_then_the_limit_is_the_initial_one() {
        let mut g = Gradient::new(GradientSettings {
            probe_samples: 5,
            ..GradientSettings::default()
        });
        for latency in [ms(50), ms(9), ms(10), ms(11)] {
            assert_eq!(g.finished(latency), 3, "pinned while probing");
        }
        assert_eq!(g.finished(ms(400)), 20, "the last sample ends the probe");
        assert_eq!(g.unloaded(), Some(ms(11)));
        assert_eq!(
            g.finished(ms(1)),
            20,
            "a latency between probes changes nothing"
        );
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
            let limit = g.window(ms(10));
            assert!(limit > last || limit == 1000, "{limit} ≤ {last}");
            last = limit;
        }
        assert_eq!(last, 1000);
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
            limit = if g.probing() {
                g.finished(latency(limit))
            } else {
                g.window(latency(limit))
            };
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
        assert_eq!(g.window(ms(10)), g.limit());
        g.window(ms(10));
        assert!(!g.probing());
        assert_eq!(g.window(ms(10)), 3, "the third window starts a probe");
        assert!(g.probing());
        assert_eq!(g.window(ms(1)), 3, "windows are ignored while probing");
        g.finished(ms(20));
        g.finished(ms(20));
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
        assert_eq!(g.settings.probe_limit, 1);
        assert_eq!(g.settings.buffer, 0.0);
        assert_eq!(g.settings.smoothing, 1.0);
        assert_eq!((g.settings.probe_samples, g.settings.probe_every), (1, 1));
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
            events in prop::collection::vec((any::<bool>(), 0u64..10_000_000), 1..400),
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
            for (finished, micros) in events {
                let before = g.limit;
                let latency = Duration::from_micros(micros);
                let limit = if finished { g.finished(latency) } else { g.window(latency) };
                prop_assert!((lo..=hi).contains(&limit), "{} not in [{}, {}]", limit, lo, hi);
                prop_assert!(g.limit <= (2.0 * before + before.sqrt()).min(f64::from(hi)) + 1e-9);
                prop_assert!(g.limit >= (before * 0.5).max(f64::from(lo)) - 1e-9);
            }
        }
    }
}
