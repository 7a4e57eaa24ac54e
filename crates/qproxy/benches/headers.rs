//! The per-request header work of the main port, on a request shaped like
//! what Knative's ingress and activator send: the `K-Original-Host`
//! rewrite, the `Forwarded` shim, and the hop-by-hop preparation of the
//! request and the response.

// criterion_group! declares an undocumented public function; a benchmark
// may unwrap, as a test does.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Request};
use qproxy::headers::{forwarded_shim, host_rewrite, prepare_request, prepare_response};

fn ingress_request() -> Request<()> {
    let mut req = Request::get("/api/items?page=2")
        .body(())
        .unwrap_or_default();
    let h = req.headers_mut();
    for (name, value) in [
        ("host", "hello.default.svc.cluster.local"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64)"),
        ("accept", "application/json"),
        ("accept-encoding", "gzip, deflate, br"),
        ("x-forwarded-for", "203.0.113.7, 10.0.0.12"),
        ("x-forwarded-proto", "https"),
        ("x-request-id", "3f2a9c4e-8d1b-4a6f-9e2d-7c5b1a0f4e3d"),
        ("k-original-host", "hello.example.com"),
        ("connection", "keep-alive"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ] {
        h.append(name, HeaderValue::from_static(value));
    }
    req
}

fn app_response() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json"),
        ("content-length", "1234"),
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("cache-control", "no-store"),
    ] {
        h.append(name, HeaderValue::from_static(value));
    }
    h
}

fn headers(c: &mut Criterion) {
    let mut group = c.benchmark_group("headers");
    let req = ingress_request();
    group.bench_function("K-Original-Host rewrite", |b| {
        b.iter_batched(
            || req.clone(),
            |mut r| {
                host_rewrite(&mut r);
                r
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("Forwarded shim", |b| {
        b.iter_batched(
            || req.headers().clone(),
            |mut h| {
                forwarded_shim(&mut h);
                h
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("prepare request (hop-by-hop)", |b| {
        b.iter_batched(
            || req.headers().clone(),
            |mut h| {
                black_box(prepare_request(&mut h));
                h
            },
            criterion::BatchSize::SmallInput,
        )
    });
    let res = app_response();
    group.bench_function("prepare response (hop-by-hop)", |b| {
        b.iter_batched(
            || res.clone(),
            |mut h| {
                prepare_response(&mut h);
                h
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, headers);
criterion_main!(benches);
