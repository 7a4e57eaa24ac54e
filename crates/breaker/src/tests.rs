use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// A waker that remembers being woken.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn poll(acquire: &mut Acquire, flag: &Arc<Flag>) -> Poll<Permit> {
    let waker = Waker::from(flag.clone());
    Pin::new(acquire).poll(&mut Context::from_waker(&waker))
}

fn admit_now(breaker: &Breaker) -> Permit {
    let mut acquire = breaker.acquire().expect("admitted");
    acquire.now().expect("a free slot")
}

#[test]
fn refuses_once_slots_and_queue_are_taken() {
    let breaker = Breaker::new(2, 3);
    let running: Vec<_> = (0..2).map(|_| admit_now(&breaker)).collect();
    let mut queued: Vec<_> = (0..3).map(|_| breaker.acquire().expect("queued")).collect();
    assert!(queued.iter_mut().all(|a| a.now().is_none()));
    assert_eq!(breaker.acquire().unwrap_err(), QueueFull);
    assert_eq!(QueueFull.to_string(), "pending request queue full");
    assert_eq!((breaker.running(), breaker.waiting()), (2, 3));
    assert_eq!(breaker.in_flight(), 5);
    drop(queued.pop());
    assert!(breaker.acquire().is_ok_and(|mut a| a.now().is_none()));
    drop(running);
    drop(queued);
    assert_eq!(breaker.in_flight(), 0);
}

#[test]
fn released_slot_goes_to_the_oldest_waiter_not_a_newcomer() {
    let breaker = Breaker::new(1, 10);
    let first = admit_now(&breaker);
    let flag = Arc::new(Flag::default());
    let mut waiter = breaker.acquire().expect("queued");
    assert!(poll(&mut waiter, &flag).is_pending());
    drop(first);
    assert!(flag.0.load(Ordering::SeqCst), "the waiter was woken");
    // The slot is spoken for: a newcomer queues behind.
    let mut newcomer = breaker.acquire().expect("queued");
    assert!(newcomer.now().is_none());
    let permit = poll(&mut waiter, &flag);
    assert!(permit.is_ready());
    assert_eq!((breaker.running(), breaker.waiting()), (1, 1));
}

#[test]
fn dropping_a_granted_but_unpolled_waiter_passes_the_slot_on() {
    let breaker = Breaker::new(1, 10);
    let first = admit_now(&breaker);
    let second = breaker.acquire().expect("queued");
    let flag = Arc::new(Flag::default());
    let mut third = breaker.acquire().expect("queued");
    assert!(poll(&mut third, &flag).is_pending());
    drop(first); // `second` is handed the slot...
    drop(second); // ...and gives it up before using it.
    assert!(flag.0.load(Ordering::SeqCst));
    assert!(poll(&mut third, &flag).is_ready());
    assert_eq!((breaker.running(), breaker.waiting()), (0, 0));
}

#[test]
fn growing_wakes_waiters_and_shrinking_lets_running_finish() {
    let breaker = Breaker::new(1, 10);
    let running = admit_now(&breaker);
    let flags: Vec<_> = (0..3).map(|_| Arc::new(Flag::default())).collect();
    let mut waiters: Vec<_> = flags
        .iter()
        .map(|f| {
            let mut a = breaker.acquire().expect("queued");
            assert!(poll(&mut a, f).is_pending());
            a
        })
        .collect();
    breaker.set_capacity(3);
    assert_eq!(breaker.capacity(), 3);
    assert!(flags[0].0.load(Ordering::SeqCst) && flags[1].0.load(Ordering::SeqCst));
    assert!(!flags[2].0.load(Ordering::SeqCst));
    let permits: Vec<_> = waiters
        .drain(..2)
        .map(|mut a| match poll(&mut a, &flags[0]) {
            Poll::Ready(p) => p,
            Poll::Pending => panic!("granted"),
        })
        .collect();
    breaker.set_capacity(1);
    drop(permits); // 3 running, capacity 1: two releases give nothing out
    assert!(!flags[2].0.load(Ordering::SeqCst));
    drop(running);
    assert!(flags[2].0.load(Ordering::SeqCst));
    assert!(poll(&mut waiters[0], &flags[2]).is_ready());
}

#[test]
fn zero_capacity_queues_everything() {
    let breaker = Breaker::new(0, 2);
    let mut a = breaker.acquire().expect("queued");
    let _b = breaker.acquire().expect("queued");
    assert!(breaker.acquire().is_err());
    breaker.set_capacity(1);
    let flag = Arc::new(Flag::default());
    let permit = poll(&mut a, &flag);
    assert!(permit.is_ready());
}

#[test]
fn contended_threads_never_exceed_capacity() {
    use std::sync::atomic::AtomicU32;
    let breaker = Breaker::new(2, 1000);
    let inside = Arc::new(AtomicU32::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (breaker, inside) = (breaker.clone(), inside.clone());
                tokio::spawn(async move {
                    for _ in 0..2000 {
                        let permit = breaker.acquire().expect("admitted").await;
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= 2, "{now} inside with capacity 2");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
    });
    assert_eq!(breaker.in_flight(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Arrive,
    Poll(usize),
    Cancel(usize),
    Finish(usize),
    SetCapacity(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Arrive),
        3 => any::<usize>().prop_map(Op::Poll),
        2 => any::<usize>().prop_map(Op::Cancel),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => (0u32..5).prop_map(Op::SetCapacity),
    ]
}

/// A queued request as the test sees it.
struct Waiter {
    id: u64,
    acquire: Acquire,
    flag: Arc<Flag>,
    polled: bool,
}

/// What the breaker should be doing, written the simple way.
#[derive(Debug)]
struct Model {
    capacity: u32,
    depth: u32,
    /// Slots taken, including those handed to waiters not yet polled.
    running: u32,
    /// Waiting, oldest first.
    queue: VecDeque<u64>,
    /// Handed a slot, not yet polled.
    granted: Vec<u64>,
}

impl Model {
    fn release(&mut self) {
        if !self.queue.is_empty() && self.running <= self.capacity {
            let id = self.queue.pop_front().expect("non-empty");
            self.granted.push(id);
        } else {
            self.running -= 1;
        }
    }

    fn grow(&mut self) {
        while self.running < self.capacity {
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            self.running += 1;
            self.granted.push(id);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random arrivals, polls, cancellations, completions and capacity
    /// changes: the breaker does exactly what the model does, wakes every
    /// waiter it hands a slot to, and ends empty.
    #[test]
    fn behaves_like_the_model(
        capacity in 0u32..4,
        depth in 0u32..6,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let breaker = Breaker::new(capacity, depth);
        let mut model = Model { capacity, depth, running: 0, queue: VecDeque::new(), granted: Vec::new() };
        let mut waiters: Vec<Waiter> = Vec::new();
        let mut permits: Vec<Permit> = Vec::new();
        let mut next_id = 0u64;

        for op in ops {
            match op {
                Op::Arrive => {
                    let full = model.running + model.queue.len() as u32
                        >= model.capacity + model.depth;
                    let free = model.queue.is_empty() && model.running < model.capacity;
                    match breaker.acquire() {
                        Err(QueueFull) => prop_assert!(full && !free, "refused with room: {model:?}"),
                        Ok(mut acquire) => {
                            prop_assert!(!full || free, "admitted over the limit: {model:?}");
                            if let Some(permit) = acquire.now() {
                                prop_assert!(free, "took a slot past the queue: {model:?}");
                                model.running += 1;
                                permits.push(permit);
                            } else {
                                prop_assert!(!free, "queued beside a free slot: {model:?}");
                                model.queue.push_back(next_id);
                                waiters.push(Waiter { id: next_id, acquire, flag: Arc::default(), polled: false });
                            }
                            next_id += 1;
                        }
                    }
                }
                Op::Poll(i) if !waiters.is_empty() => {
                    let i = i % waiters.len();
                    let w = &mut waiters[i];
                    let granted = model.granted.contains(&w.id);
                    match poll(&mut w.acquire, &w.flag) {
                        Poll::Ready(permit) => {
                            prop_assert!(granted, "ran before its turn");
                            // FIFO: nobody who arrived earlier still waits.
                            prop_assert!(model.queue.iter().all(|id| *id > w.id), "overtook the queue");
                            model.granted.retain(|id| *id != w.id);
                            permits.push(permit);
                            waiters.remove(i);
                        }
                        Poll::Pending => {
                            prop_assert!(!granted, "granted but still pending");
                            w.polled = true;
                        }
                    }
                }
                Op::Cancel(i) if !waiters.is_empty() => {
                    let w = waiters.remove(i % waiters.len());
                    if let Some(pos) = model.granted.iter().position(|id| *id == w.id) {
                        model.granted.remove(pos);
                        model.release();
                    } else {
                        model.queue.retain(|id| *id != w.id);
                    }
                }
                Op::Finish(i) if !permits.is_empty() => {
                    drop(permits.swap_remove(i % permits.len()));
                    model.release();
                }
                Op::SetCapacity(c) => {
                    breaker.set_capacity(c);
                    model.capacity = c;
                    model.grow();
                }
                _ => {}
            }
            prop_assert_eq!(breaker.running(), model.running);
            prop_assert_eq!(breaker.waiting(), model.queue.len() as u32);
            prop_assert_eq!(breaker.in_flight(), model.running + model.queue.len() as u32);
            prop_assert_eq!(model.running as usize, permits.len() + model.granted.len());
            for w in &waiters {
                if w.polled && model.granted.contains(&w.id) {
                    prop_assert!(w.flag.0.load(Ordering::SeqCst), "granted waiter {} never woken", w.id);
                }
            }
        }

        // Everyone admitted either runs or was cancelled; then it is empty.
        breaker.set_capacity(1);
        drop(permits);
        while !waiters.is_empty() {
            let w = waiters.remove(0);
            let mut acquire = w.acquire;
            match poll(&mut acquire, &w.flag) {
                Poll::Ready(permit) => drop(permit),
                Poll::Pending => prop_assert!(false, "waiter {} stuck with nothing running", w.id),
            }
        }
        prop_assert_eq!(breaker.in_flight(), 0);
    }
}

/// An adaptive breaker holds the app to the probe's limit until the probe
/// has its samples, then opens to the rule's initial limit, handing the new
/// slots to the queue at once.
#[test]
fn an_adaptive_breaker_probes_then_opens_to_its_initial_limit() {
    let settings = GradientSettings {
        probe_samples: 2,
        initial: 5,
        ..GradientSettings::default()
    };
    let breaker = Breaker::adaptive(settings, Duration::ZERO, 10);
    assert!(breaker.is_adaptive() && !Breaker::new(1, 1).is_adaptive());
    assert_eq!(breaker.capacity(), 3);
    let mut running: VecDeque<_> = (0..3).map(|_| admit_now(&breaker)).collect();
    let flag = Arc::new(Flag::default());
    let mut queued: Vec<_> = (0..4).map(|_| breaker.acquire().expect("queued")).collect();
    assert!(queued.iter_mut().all(|a| poll(a, &flag).is_pending()));
    drop(running.pop_front());
    assert_eq!(breaker.capacity(), 3, "one sample of two");
    let Poll::Ready(first) = poll(&mut queued[0], &flag) else {
        panic!("its slot handed over");
    };
    drop(running.pop_front());
    assert_eq!(breaker.capacity(), 5, "the probe is over");
    assert_eq!((breaker.running(), breaker.waiting()), (5, 0));
    assert!(queued[1..].iter_mut().all(|a| poll(a, &flag).is_ready()));
    drop(first);
}
