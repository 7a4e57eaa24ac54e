//! The cost of recording a request (an in and an out event), with the
//! sharded recorder and with a recorder behind one mutex, as Knative's, in
//! the same run, on 1 and 2 threads; and encoding the `Stat` message.

// criterion_group! declares an undocumented public function; a benchmark
// may unwrap, as a test does.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use qproxy_autoscaler_client::{Event, Nanos, RequestStats};

/// Knative's shape: one mutex around the whole state.
#[derive(Default)]
struct Locked {
    concurrency: f64,
    last: Nanos,
    integral: f64,
    requests: f64,
}

impl Locked {
    fn record(&mut self, event: Event, now: Nanos) {
        if now > self.last {
            self.integral += self.concurrency * (now - self.last) as f64 / 1e9;
            self.last = now;
        }
        match event {
            Event::In | Event::ProxiedIn => {
                self.concurrency += 1.0;
                self.requests += 1.0;
            }
            Event::Out | Event::ProxiedOut => self.concurrency -= 1.0,
        }
    }
}

fn per_request(c: &mut Criterion) {
    for threads in [1u64, 2] {
        let mut group = c.benchmark_group(format!("record a request, {threads} thread(s)"));
        group.bench_function("sharded", |b| {
            b.iter_custom(|iters| {
                let stats = RequestStats::new(0);
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| {
                            for i in 0..iters {
                                stats.record(Event::In, black_box(i * 10));
                                stats.record(Event::Out, black_box(i * 10 + 5));
                            }
                        });
                    }
                });
                start.elapsed() / threads as u32
            })
        });
        group.bench_function("one mutex", |b| {
            b.iter_custom(|iters| {
                let stats = Mutex::new(Locked::default());
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| {
                            for i in 0..iters {
                                stats.lock().unwrap().record(Event::In, black_box(i * 10));
                                stats
                                    .lock()
                                    .unwrap()
                                    .record(Event::Out, black_box(i * 10 + 5));
                            }
                        });
                    }
                });
                start.elapsed() / threads as u32
            })
        });
        group.finish();
    }
}

/// Encoding the `Stat` the autoscaler scrapes every second.
fn encode_stat(c: &mut Criterion) {
    let stat = qproxy_autoscaler_client::Stat {
        pod_name: "hello-00001-deployment-6d8d4bd5b-x7k2p".to_owned(),
        average_concurrent_requests: 3.25,
        average_proxied_concurrent_requests: 0.5,
        request_count: 120.0,
        proxied_request_count: 8.0,
        process_uptime: 3600.5,
        timestamp: 0,
    };
    c.bench_function("encode a Stat", |b| {
        b.iter(|| prost::Message::encode_to_vec(black_box(&stat)))
    });
}

criterion_group!(benches, per_request, encode_stat);
criterion_main!(benches);
