//! A breaker whose capacity follows the app: the [gradient
//! rule](crate::gradient) applied to the slots.
//!
//! The rule wants, window by window, the mean latency of the requests that
//! finished and how many the app held on average. Both come from the slots
//! alone, with nothing kept per request: a [`Meter`] adds up the time the
//! slots were held (the number held times the time it was held, updated as
//! each slot is taken or given back) and counts the slots given back. Over
//! a window, that time divided by the slots given back is the mean time a
//! request held its slot (Little's law), and divided by the window's
//! length it is the mean number held.
//!
//! A slot is held from when its request gets it until its response body
//! has been sent, so what is measured is the app's time plus the time a
//! client takes to read the response, as Envoy's filter measures it.
//!
//! A window closes with the first slot given back once `interval` has
//! passed since the last one closed, so a breaker with nothing to do does
//! nothing; the new limit becomes the breaker's capacity.

use std::time::{Duration, Instant};

use crate::gradient::{Gradient, GradientSettings, Window};
use crate::sync::{Mutex, MutexGuard};

/// The meter of an adaptive breaker, and its rule.
pub(crate) struct Adaptive {
    epoch: Instant,
    interval: Duration,
    meter: Mutex<Meter>,
}

/// What the slots did since the last window closed, and the rule.
struct Meter {
    /// When the slots last changed hands, since the epoch.
    last: Duration,
    /// Slots held now.
    held: u32,
    /// Slot-seconds held since the window opened.
    held_for: f64,
    /// Slots given back since the window opened.
    finished: u64,
    /// When the window opened, since the epoch.
    opened: Duration,
    gradient: Gradient,
}

impl Meter {
    /// Adds the slot time up to `now`.
    fn advance(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.last);
        self.held_for += f64::from(self.held) * elapsed.as_secs_f64();
        self.last = self.last.max(now);
    }
}

impl Adaptive {
    /// A meter with windows of `interval`, applying `settings`.
    pub(crate) fn new(settings: GradientSettings, interval: Duration) -> Self {
        Adaptive {
            epoch: Instant::now(),
            interval,
            meter: Mutex::new(Meter {
                last: Duration::ZERO,
                held: 0,
                held_for: 0.0,
                finished: 0,
                opened: Duration::ZERO,
                gradient: Gradient::new(settings),
            }),
        }
    }

    /// The limit to apply now.
    pub(crate) fn limit(&self) -> u32 {
        self.lock().gradient.limit()
    }

    /// The unloaded latency, once measured.
    pub(crate) fn unloaded(&self) -> Option<Duration> {
        self.lock().gradient.unloaded()
    }

    /// A slot was taken.
    pub(crate) fn took(&self) {
        self.took_at(self.epoch.elapsed());
    }

    /// A slot was given back. Returns the new limit when this closed a
    /// window.
    pub(crate) fn gave_back(&self) -> Option<u32> {
        let closed = self.closing_at(self.epoch.elapsed());
        closed.map(|(_, limit)| limit)
    }

    /// A slot was taken at `now` (since the epoch).
    fn took_at(&self, now: Duration) {
        let mut meter = self.lock();
        meter.advance(now);
        meter.held = meter.held.saturating_add(1);
    }

    /// A slot was given back at `now` (since the epoch); the window it closed, if it did,
    /// and the new limit.
    fn closing_at(&self, now: Duration) -> Option<(Window, u32)> {
        let mut meter = self.lock();
        meter.advance(now);
        meter.held = meter.held.saturating_sub(1);
        meter.finished += 1;
        let length = now.saturating_sub(meter.opened);
        if length < self.interval {
            return None;
        }
        let held_for = meter.held_for;
        let window = Window {
            latency: Duration::try_from_secs_f64(held_for / meter.finished as f64)
                .unwrap_or(Duration::MAX),
            finished: meter.finished,
            held: held_for / length.as_secs_f64().max(f64::MIN_POSITIVE),
        };
        meter.held_for = 0.0;
        meter.finished = 0;
        meter.opened = now;
        Some((window, meter.gradient.window(window)))
    }

    fn lock(&self) -> MutexGuard<'_, Meter> {
        // Nothing panics while holding the lock; the meter is consistent
        // between its statements anyway.
        self.meter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_is_the_slots_mean_hold_and_the_mean_held() {
        let adaptive = Adaptive::new(GradientSettings::default(), ms(100));
        // Two slots taken at 0 and 20 ms, given back at 40 and 120 ms, a
        // third taken at 60 ms and still held when the window closes.
        adaptive.took_at(ms(0));
        adaptive.took_at(ms(20));
        assert!(adaptive.closing_at(ms(40)).is_none(), "the window is open");
        adaptive.took_at(ms(60));
        let (window, limit) = adaptive.closing_at(ms(120)).expect("closed");
        // Held: 40 + 100 + 60 ms = 200 ms over 120 ms, by two finished.
        assert_eq!(window.finished, 2);
        assert_eq!(window.latency, ms(100));
        assert!(
            (window.held - 200.0 / 120.0).abs() < 1e-9,
            "{}",
            window.held
        );
        assert_eq!(limit, 3, "still probing");
        // The next window counts only its own share of the third slot's
        // hold, 100 of its 160 ms (given back at 220 ms).
        let (window, _) = adaptive.closing_at(ms(220)).expect("closed");
        assert_eq!((window.finished, window.latency), (1, ms(100)));
        assert!((window.held - 1.0).abs() < 1e-9, "{}", window.held);
    }

    #[test]
    fn the_probe_s_windows_give_the_unloaded_latency() {
        let settings = GradientSettings {
            probe_samples: 4,
            ..GradientSettings::default()
        };
        let adaptive = Adaptive::new(settings, ms(10));
        assert_eq!(adaptive.limit(), 3);
        for i in 0..4 {
            adaptive.took_at(ms(20 * i));
            adaptive.closing_at(ms(20 * i + 10));
        }
        assert_eq!(adaptive.unloaded(), Some(ms(10)));
        assert_eq!(adaptive.limit(), settings.initial);
    }
}
