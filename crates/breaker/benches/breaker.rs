//! The breaker against a plain `tokio::sync::Semaphore` doing the same job,
//! side by side in one run: a free slot taken and given back, two threads
//! contending for one slot, and a hundred requests queued behind one.

// criterion_group! declares an undocumented public function; a benchmark
// may unwrap, as a test does.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use qproxy_breaker::Breaker;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::Semaphore;

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended acquire+release");
    let breaker = Breaker::new(10, 100);
    group.bench_function("breaker", |b| {
        b.iter(|| {
            let permit = breaker.acquire().ok().and_then(|mut a| a.now());
            black_box(permit)
        })
    });
    let semaphore = Arc::new(Semaphore::new(10));
    group.bench_function("tokio semaphore", |b| {
        b.iter(|| black_box(semaphore.clone().try_acquire_owned().ok()))
    });
    group.finish();
}

fn runtime(threads: usize) -> Runtime {
    let mut builder = if threads > 1 {
        let mut b = Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    } else {
        Builder::new_current_thread()
    };
    builder.build().expect("tokio runtime")
}

/// Runs `tasks` tasks each taking and releasing a slot `rounds` times;
/// returns the elapsed time.
async fn contend<F, Fut>(tasks: usize, rounds: u64, take: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future + Send,
    Fut::Output: Send,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let take = take.clone();
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let permit = take().await;
                    tokio::task::yield_now().await;
                    drop(permit);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("bench task");
    }
    start.elapsed()
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("2 threads contending for 1 slot");
    let rt = runtime(2);
    group.bench_function("breaker", |b| {
        b.iter_custom(|iters| {
            let breaker = Breaker::new(1, 10);
            rt.block_on(contend(2, iters, move || {
                let breaker = breaker.clone();
                async move { breaker.acquire().expect("admitted").await }
            }))
        })
    });
    group.bench_function("tokio semaphore", |b| {
        b.iter_custom(|iters| {
            let semaphore = Arc::new(Semaphore::new(1));
            rt.block_on(contend(2, iters, move || semaphore.clone().acquire_owned()))
        })
    });
    group.finish();
}

fn hundred_waiters(c: &mut Criterion) {
    let mut group = c.benchmark_group("100 waiters through 1 slot");
    let rt = runtime(1);
    group.bench_function("breaker", |b| {
        b.iter_custom(|iters| {
            let breaker = Breaker::new(1, 1000);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let breaker = breaker.clone();
                total += rt.block_on(contend(100, 1, move || {
                    let breaker = breaker.clone();
                    async move { breaker.acquire().expect("admitted").await }
                }));
            }
            total
        })
    });
    group.bench_function("tokio semaphore", |b| {
        b.iter_custom(|iters| {
            let semaphore = Arc::new(Semaphore::new(1));
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let semaphore = semaphore.clone();
                total += rt.block_on(contend(100, 1, move || semaphore.clone().acquire_owned()));
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, uncontended, two_threads, hundred_waiters);
criterion_main!(benches);
