//! Every interleaving of a few threads racing through the breaker's
//! lock-free and locked paths, explored by loom. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p qproxy-breaker --release --test loom`.
#![cfg(loom)]

use std::time::Duration;

use loom::future::block_on;
use loom::thread;
use qproxy_breaker::{Breaker, GradientSettings};

/// Two requests for one slot: both run, one after the other, and the
/// breaker ends empty.
#[test]
fn two_requests_one_slot() {
    loom::model(|| {
        let breaker = Breaker::new(1, 1);
        let other = breaker.clone();
        let t = thread::spawn(move || {
            let permit = block_on(other.acquire().expect("admitted"));
            assert!(other.running() <= 1);
            drop(permit);
        });
        let permit = block_on(breaker.acquire().expect("admitted"));
        assert!(breaker.running() <= 1);
        drop(permit);
        t.join().expect("thread");
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// A queued request given up while the slot is being released: neither
/// the slot nor the place leaks.
#[test]
fn cancel_races_release() {
    loom::model(|| {
        let breaker = Breaker::new(1, 1);
        let mut held = breaker.acquire().expect("admitted");
        let permit = held.now().expect("free slot");
        let waiting = breaker.acquire().expect("queued");
        let t = thread::spawn(move || drop(permit));
        drop(waiting);
        t.join().expect("thread");
        assert_eq!(breaker.in_flight(), 0);
        assert!(breaker.acquire().expect("admitted").now().is_some());
    });
}

/// A request arriving while the only slot is released: it either takes the
/// free slot or queues and is handed it; never stuck beside a free slot.
#[test]
fn arrival_races_release() {
    loom::model(|| {
        let breaker = Breaker::new(1, 1);
        let permit = breaker.acquire().expect("admitted").now().expect("free");
        let t = thread::spawn(move || drop(permit));
        let second = block_on(breaker.acquire().expect("admitted"));
        t.join().expect("thread");
        drop(second);
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// Growing the capacity while a request queues: the request is not left
/// waiting beside the new slot.
#[test]
fn arrival_races_growth() {
    loom::model(|| {
        let breaker = Breaker::new(0, 1);
        let other = breaker.clone();
        let t = thread::spawn(move || other.set_capacity(1));
        let permit = block_on(breaker.acquire().expect("admitted"));
        t.join().expect("thread");
        drop(permit);
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// A request handed a slot gives it up, unpolled, while another slot is
/// released: the request behind it still gets one.
#[test]
fn granted_waiter_dropped_during_release() {
    loom::model(|| {
        let breaker = Breaker::new(1, 2);
        let permit = breaker.acquire().expect("admitted").now().expect("free");
        let first = breaker.acquire().expect("queued");
        let second = breaker.acquire().expect("queued");
        let t = thread::spawn(move || drop(permit));
        drop(first);
        t.join().expect("thread");
        drop(block_on(second));
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// Growing the capacity while a slot is released: the waiter is served
/// once, and nothing leaks.
#[test]
fn growth_races_release() {
    loom::model(|| {
        let breaker = Breaker::new(1, 1);
        let permit = breaker.acquire().expect("admitted").now().expect("free");
        let waiter = breaker.acquire().expect("queued");
        let other = breaker.clone();
        let t = thread::spawn(move || other.set_capacity(2));
        drop(permit);
        drop(block_on(waiter));
        t.join().expect("thread");
        assert_eq!(breaker.in_flight(), 0);
        assert_eq!(breaker.running(), 0);
    });
}

/// Shrinking while both slots are released: the waiter gets one slot,
/// whether it was handed over before the shrink or after.
#[test]
fn shrink_races_releases() {
    loom::model(|| {
        let breaker = Breaker::new(2, 1);
        let p1 = breaker.acquire().expect("admitted").now().expect("free");
        let p2 = breaker.acquire().expect("admitted").now().expect("free");
        let waiter = breaker.acquire().expect("queued");
        let other = breaker.clone();
        let t = thread::spawn(move || {
            other.set_capacity(1);
            drop(p1);
        });
        drop(p2);
        let permit = block_on(waiter);
        t.join().expect("thread");
        assert_eq!(breaker.running(), 1);
        drop(permit);
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// The slot of an adaptive breaker given back, closing the probe's window
/// and growing the limit, while a request waits: the meter's lock and the
/// queue's never deadlock, the waiter is served once (handed the slot, or
/// one of the new ones), and the breaker ends empty at the new limit.
#[test]
fn adaptive_window_races_waiter() {
    loom::model(|| {
        let settings = GradientSettings {
            probe_limit: 1,
            probe_samples: 1,
            initial: 2,
            ..GradientSettings::default()
        };
        let breaker = Breaker::adaptive(settings, Duration::ZERO, 1);
        let permit = breaker.acquire().expect("admitted").now().expect("free");
        let waiter = breaker.acquire().expect("queued");
        let t = thread::spawn(move || drop(permit));
        let second = block_on(waiter);
        t.join().expect("thread");
        assert_eq!(breaker.capacity(), 2);
        assert_eq!(breaker.running(), 1);
        drop(second);
        assert_eq!(breaker.in_flight(), 0);
    });
}

/// Two slots of an adaptive breaker given back at once, each closing a
/// window and applying a limit: the breaker ends empty, at a limit the
/// rule gave.
#[test]
fn adaptive_windows_race() {
    loom::model(|| {
        let settings = GradientSettings {
            probe_limit: 2,
            probe_samples: 1,
            initial: 4,
            ..GradientSettings::default()
        };
        let breaker = Breaker::adaptive(settings, Duration::ZERO, 0);
        let p1 = breaker.acquire().expect("admitted").now().expect("free");
        let p2 = breaker.acquire().expect("admitted").now().expect("free");
        let t = thread::spawn(move || drop(p1));
        drop(p2);
        t.join().expect("thread");
        assert_eq!(breaker.in_flight(), 0);
        assert!((2..=6).contains(&breaker.capacity()), "{breaker:?}");
    });
}
