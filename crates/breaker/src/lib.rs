//! `containerConcurrency` enforcement for qproxy.
//!
//! A [`Breaker`] is what Knative calls the queue-proxy's breaker: `capacity`
//! slots for requests inside the user container, a bounded FIFO queue of
//! requests waiting for a slot (`10 × capacity` in Knative), and immediate
//! refusal, [`QueueFull`] (`pending request queue full`), once both are
//! taken.
//!
//! ```
//! # async fn serve(breaker: &qproxy_breaker::Breaker) -> Result<(), qproxy_breaker::QueueFull> {
//! let permit = breaker.acquire()?.await; // refused at once, or queued
//! // ... the request runs; dropping the permit frees its slot ...
//! drop(permit);
//! # Ok(()) }
//! ```
//!
//! [`BreakerLayer`] puts a breaker in front of an HTTP tower service and
//! holds each request's slot until its response body is finished.
//!
//! [`Breaker::adaptive`] makes a breaker whose capacity is found from the
//! app's latency, for apps without a fixed limit (adaptive concurrency):
//! the [`Gradient`] rule, fed by the slots themselves (see
//! [`gradient`] and the adaptive meter's notes on [`Breaker::adaptive`]).
//!
//! # Invariants
//!
//! One atomic word holds the number of slots taken (`running`) and the
//! number of queued requests (`waiting`); a mutex guards the queue itself.
//!
//! - **Admission.** A request is admitted while `running + waiting` is below
//!   `capacity + queue_depth`, and refused at once otherwise. The bound
//!   follows the current capacity.
//! - **No free slot while anyone waits.** Whenever `waiting > 0`,
//!   `running >= capacity`, except while a release is under way: it frees
//!   its slot in one atomic step, sees the waiters, and takes the lock to
//!   hand a slot to the oldest; until then nobody else can take the slot.
//!   A request takes a slot directly only when nobody is queued, so a
//!   newcomer can never overtake the queue (FIFO), and a waiter is never
//!   left asleep next to a free slot (no lost wake-ups).
//! - **Only the lock changes `waiting`.** Queueing, handing a slot over and
//!   cancelling all happen under the queue's mutex, and `waiting` always
//!   equals the queue's length once the mutex is released. Without the lock,
//!   `running` only rises while `waiting` is zero (a compare-and-swap on the
//!   whole word, which fails as soon as a request queues) and falls on
//!   release.
//! - **Cancellation.** Dropping an [`Acquire`] that is still queued removes
//!   it from the queue and frees its place; dropping one that was handed a
//!   slot but not polled since releases that slot to the next waiter.
//!   Dropping a [`Permit`] releases its slot. No pattern of drops leaks a
//!   slot or a place in the queue.
//! - **Capacity changes.** Growing hands the new slots to waiters at once;
//!   shrinking lets the requests running finish and gives no slot out until
//!   `running` is below the new capacity.
//!
//! The uncontended path, a free slot taken and released, is one
//! compare-and-swap and one subtraction, and never touches the mutex.

mod adaptive;
pub mod gradient;
mod service;
mod sync;

pub use gradient::{Gradient, GradientSettings, Window};

pub use service::{
    BreakerLayer, BreakerService, Exempt, NoneExempt, PermitBody, ResponseFuture, Untold, Waited,
};

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::adaptive::Adaptive;

use crate::sync::{Arc, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};

/// A request refused because every slot and every place in the queue is
/// taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("pending request queue full")]
pub struct QueueFull;

/// `waiting` lives in the high half of the state word, `running` in the low.
const ONE_WAITING: u64 = 1 << 32;

fn running(state: u64) -> u32 {
    state as u32
}

fn waiting(state: u64) -> u32 {
    (state >> 32) as u32
}

/// A concurrency limiter with `capacity` slots and a bounded FIFO queue.
///
/// Cloning is cheap and gives another handle to the same breaker.
#[derive(Clone)]
pub struct Breaker {
    shared: Arc<Shared>,
}

struct Shared {
    /// `waiting << 32 | running`.
    state: AtomicU64,
    /// Changed only under the queue's mutex.
    capacity: AtomicU32,
    queue_depth: u32,
    queue: Mutex<Queue>,
    /// The meter and rule of an adaptive breaker.
    adaptive: Option<Adaptive>,
}

/// The requests waiting for a slot, oldest first.
#[derive(Default)]
struct Queue {
    next_ticket: u64,
    /// Tickets, in increasing order, with the waker of their last poll. A
    /// ticket leaves when its request is handed a slot or cancelled.
    waiters: VecDeque<(u64, Option<Waker>)>,
}

impl Queue {
    fn push(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiters.push_back((ticket, None));
        ticket
    }

    fn pop_first(&mut self) -> Option<Option<Waker>> {
        self.waiters.pop_front().map(|(_, waker)| waker)
    }

    fn find(&self, ticket: u64) -> Result<usize, usize> {
        self.waiters.binary_search_by_key(&ticket, |(t, _)| *t)
    }

    fn waker_mut(&mut self, ticket: u64) -> Option<&mut Option<Waker>> {
        let at = self.find(ticket).ok()?;
        self.waiters.get_mut(at).map(|(_, waker)| waker)
    }

    fn remove(&mut self, ticket: u64) -> bool {
        match self.find(ticket) {
            Ok(at) => self.waiters.remove(at).is_some(),
            Err(_) => false,
        }
    }
}

impl Breaker {
    /// A breaker with `capacity` slots and room for `queue_depth` waiting
    /// requests.
    pub fn new(capacity: u32, queue_depth: u32) -> Self {
        Breaker {
            shared: Arc::new(Shared {
                state: AtomicU64::new(0),
                capacity: AtomicU32::new(capacity),
                queue_depth,
                queue: Mutex::new(Queue::default()),
                adaptive: None,
            }),
        }
    }

    /// A breaker whose capacity the [`Gradient`] rule with `settings` finds
    /// from the app's latency, window by window, with room for
    /// `queue_depth` waiting requests. It starts at the rule's probe limit.
    ///
    /// The rule is fed from the slots, with nothing kept per request: the
    /// time slots are held and the number given back, over each window
    /// (at least `interval`, closed by the first slot given back after it),
    /// give the mean time a request held its slot (Little's law) and the
    /// mean number held. A slot is held until the response body has been
    /// sent, so a client slow to read counts as a slower app. The new limit
    /// is applied as [`Breaker::set_capacity`] applies one.
    pub fn adaptive(settings: GradientSettings, interval: Duration, queue_depth: u32) -> Self {
        let adaptive = Adaptive::new(settings, interval);
        Breaker {
            shared: Arc::new(Shared {
                state: AtomicU64::new(0),
                capacity: AtomicU32::new(adaptive.limit()),
                queue_depth,
                queue: Mutex::new(Queue::default()),
                adaptive: Some(adaptive),
            }),
        }
    }

    /// Whether the capacity follows the app ([`Breaker::adaptive`]).
    pub fn is_adaptive(&self) -> bool {
        self.shared.adaptive.is_some()
    }

    /// The app's unloaded latency, as an adaptive breaker last measured it.
    pub fn unloaded(&self) -> Option<Duration> {
        self.shared.adaptive.as_ref().and_then(Adaptive::unloaded)
    }

    /// Admits a request, or refuses it at once with [`QueueFull`].
    ///
    /// An admitted request holds its place until the returned [`Acquire`]
    /// resolves to a [`Permit`] (at once when a slot is free and nobody is
    /// waiting) or is dropped.
    pub fn acquire(&self) -> Result<Acquire, QueueFull> {
        let shared = &*self.shared;
        let mut state = shared.state.load(Ordering::Acquire);
        loop {
            let capacity = shared.capacity.load(Ordering::Acquire);
            if waiting(state) != 0 || running(state) >= capacity {
                if shared.is_full(state, capacity) {
                    return Err(QueueFull);
                }
                return self.enqueue();
            }
            match shared.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Acquire::ready(self.permit())),
                Err(actual) => state = actual,
            }
        }
    }

    /// The slow path of [`Breaker::acquire`], under the queue's lock.
    fn enqueue(&self) -> Result<Acquire, QueueFull> {
        let shared = &*self.shared;
        let mut queue = shared.lock();
        let capacity = shared.capacity.load(Ordering::Acquire);
        let mut state = shared.state.load(Ordering::Acquire);
        loop {
            let slot_free = waiting(state) == 0 && running(state) < capacity;
            if !slot_free && shared.is_full(state, capacity) {
                return Err(QueueFull);
            }
            let next = if slot_free {
                state + 1
            } else {
                state + ONE_WAITING
            };
            match shared.state.compare_exchange_weak(
                state,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) if slot_free => return Ok(Acquire::ready(self.permit())),
                Ok(_) => break,
                Err(actual) => state = actual,
            }
        }
        let ticket = queue.push();
        Ok(Acquire {
            state: AcquireState::Queued {
                shared: Some(self.shared.clone()),
                ticket,
            },
        })
    }

    fn permit(&self) -> Permit {
        Permit::new(self.shared.clone())
    }

    /// Changes the number of slots. Growing hands the new slots to waiting
    /// requests at once; shrinking lets running requests finish.
    pub fn set_capacity(&self, capacity: u32) {
        self.shared.set_capacity(capacity);
    }

    /// The number of slots.
    pub fn capacity(&self) -> u32 {
        self.shared.capacity.load(Ordering::Acquire)
    }

    /// The number of requests that may wait for a slot.
    pub fn queue_depth(&self) -> u32 {
        self.shared.queue_depth
    }

    /// Requests admitted and not finished: running plus waiting (at most
    /// `u32::MAX`).
    pub fn in_flight(&self) -> u32 {
        let state = self.shared.state.load(Ordering::Relaxed);
        running(state).saturating_add(waiting(state))
    }

    /// Requests holding a slot.
    pub fn running(&self) -> u32 {
        running(self.shared.state.load(Ordering::Relaxed))
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> u32 {
        waiting(self.shared.state.load(Ordering::Relaxed))
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.state.load(Ordering::Relaxed);
        f.debug_struct("Breaker")
            .field("capacity", &self.capacity())
            .field("queue_depth", &self.queue_depth())
            .field("running", &running(state))
            .field("waiting", &waiting(state))
            .finish()
    }
}

impl Shared {
    /// See [`Breaker::set_capacity`].
    fn set_capacity(&self, capacity: u32) {
        let mut woken = Vec::new();
        {
            let mut queue = self.lock();
            self.capacity.store(capacity, Ordering::Release);
            loop {
                // `waiting > 0` here: only releases move `running`, and
                // only down.
                let state = self.state.load(Ordering::Acquire);
                if waiting(state) == 0 || running(state) >= capacity {
                    break;
                }
                let Some(waker) = queue.pop_first() else {
                    break;
                };
                // One waiter fewer, one slot more.
                self.state.fetch_sub(ONE_WAITING - 1, Ordering::AcqRel);
                woken.extend(waker);
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding the lock; if something ever did, the
        // queue is still consistent, so carry on with it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_full(&self, state: u64, capacity: u32) -> bool {
        u64::from(running(state)) + u64::from(waiting(state))
            >= u64::from(capacity) + u64::from(self.queue_depth)
    }

    /// Gives a slot back: to the oldest waiter if there is one, else to the
    /// pool.
    fn release(&self) {
        // One atomic step when nobody waits. When someone does, the slot is
        // free for a moment but nobody can take it: the lock-free path is
        // shut while `waiting > 0`, and queueing goes through the lock,
        // which hands it over.
        let before = self.state.fetch_sub(1, Ordering::AcqRel);
        if waiting(before) == 0 {
            return;
        }
        let woken = self.hand_over(&mut self.lock());
        if let Some(waker) = woken {
            waker.wake();
        }
    }

    /// Under the lock: gives a free slot, if there is one, to the oldest
    /// waiter; returns the waker to call once the lock is dropped.
    fn hand_over(&self, queue: &mut Queue) -> Option<Waker> {
        // With `waiting > 0` only lock holders raise `running`.
        let state = self.state.load(Ordering::Acquire);
        let capacity = self.capacity.load(Ordering::Acquire);
        if waiting(state) > 0 && running(state) < capacity {
            let waker = queue.pop_first()?;
            // One waiter fewer, one slot taken.
            self.state.fetch_sub(ONE_WAITING - 1, Ordering::AcqRel);
            return waker;
        }
        None
    }
}

/// A slot in the breaker. Dropping it frees the slot.
#[must_use = "the slot is freed as soon as the permit is dropped"]
pub struct Permit {
    shared: Arc<Shared>,
}

impl Permit {
    fn new(shared: Arc<Shared>) -> Self {
        if let Some(adaptive) = &shared.adaptive {
            adaptive.took();
        }
        Permit { shared }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let limit = self.shared.adaptive.as_ref().and_then(Adaptive::gave_back);
        self.shared.release();
        if let Some(limit) = limit
            && limit != self.shared.capacity.load(Ordering::Acquire)
        {
            self.shared.set_capacity(limit);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

/// An admitted request waiting for its slot; resolves to the [`Permit`].
///
/// Dropping it gives up the request's place in the queue, or the slot it
/// was just handed.
#[must_use = "the request leaves the queue as soon as this is dropped"]
pub struct Acquire {
    state: AcquireState,
}

enum AcquireState {
    /// A slot was free at admission.
    Ready(Option<Permit>),
    /// In the queue under `ticket`; `shared` is taken when the slot is.
    Queued {
        shared: Option<Arc<Shared>>,
        ticket: u64,
    },
}

impl Acquire {
    fn ready(permit: Permit) -> Self {
        Acquire {
            state: AcquireState::Ready(Some(permit)),
        }
    }

    /// The permit, if a slot was free at admission.
    pub fn now(&mut self) -> Option<Permit> {
        match &mut self.state {
            AcquireState::Ready(permit) => permit.take(),
            AcquireState::Queued { .. } => None,
        }
    }
}

impl Future for Acquire {
    type Output = Permit;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        match &mut self.get_mut().state {
            AcquireState::Ready(permit) => match permit.take() {
                Some(permit) => Poll::Ready(permit),
                None => Poll::Pending,
            },
            AcquireState::Queued { shared, ticket } => {
                let Some(arc) = shared.as_ref() else {
                    return Poll::Pending;
                };
                {
                    let mut queue = arc.lock();
                    if let Some(waker) = queue.waker_mut(*ticket) {
                        match waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => *waker = Some(cx.waker().clone()),
                        }
                        return Poll::Pending;
                    }
                }
                // Gone from the queue, and not by our own drop: the slot is
                // ours.
                match shared.take() {
                    Some(shared) => Poll::Ready(Permit::new(shared)),
                    None => Poll::Pending,
                }
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        let AcquireState::Queued { shared, ticket } = &mut self.state else {
            return;
        };
        let Some(shared) = shared.take() else {
            return;
        };
        let (left, woken) = {
            let mut queue = shared.lock();
            if queue.remove(*ticket) {
                let state = shared.state.fetch_sub(ONE_WAITING, Ordering::AcqRel);
                (Some(waiting(state) - 1), None)
            } else {
                // Handed a slot we will never use: pass it on.
                shared.state.fetch_sub(1, Ordering::AcqRel);
                (None, shared.hand_over(&mut queue))
            }
        };
        if let Some(waiting) = left {
            tracing::debug!(waiting, "queued request gave up");
        }
        if let Some(waker) = woken {
            waker.wake();
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ready = matches!(self.state, AcquireState::Ready(Some(_)));
        f.debug_struct("Acquire").field("ready", &ready).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
