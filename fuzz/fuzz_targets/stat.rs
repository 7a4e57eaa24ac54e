//! The autoscaler's `Stat` message: any bytes that decode re-encode to
//! bytes that decode to the same message, and any message survives an
//! encode and decode unchanged (NaNs stay NaNs; `-0.0`, left out as Go's
//! protobuf leaves it out, comes back as `0.0`, which compares equal).

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use qproxy_autoscaler_client::Stat;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = Stat::decode(data) {
        let encoded = decoded.encode_to_vec();
        let again = Stat::decode(&encoded[..]).expect("what was encoded decodes");
        assert!(same(&decoded, &again), "{decoded:?} came back as {again:?}");
        assert_eq!(again.encode_to_vec(), encoded, "encoding is not stable");
    }

    // The message built from the input's bytes: five figures, a timestamp,
    // then the pod name.
    if data.len() >= 48 {
        let f = |i: usize| f64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let stat = Stat {
            pod_name: String::from_utf8_lossy(&data[48..]).into_owned(),
            average_concurrent_requests: f(0),
            average_proxied_concurrent_requests: f(1),
            request_count: f(2),
            proxied_request_count: f(3),
            process_uptime: f(4),
            timestamp: i64::from_le_bytes(data[40..48].try_into().unwrap_or([0; 8])),
        };
        let encoded = stat.encode_to_vec();
        assert_eq!(encoded.len(), stat.encoded_len());
        let back = Stat::decode(&encoded[..]).expect("an encoded Stat decodes");
        assert!(same(&stat, &back), "{stat:?} came back as {back:?}");
    }
});

fn same(a: &Stat, b: &Stat) -> bool {
    let f = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan());
    a.pod_name == b.pod_name
        && f(a.average_concurrent_requests, b.average_concurrent_requests)
        && f(
            a.average_proxied_concurrent_requests,
            b.average_proxied_concurrent_requests,
        )
        && f(a.request_count, b.request_count)
        && f(a.proxied_request_count, b.proxied_request_count)
        && f(a.process_uptime, b.process_uptime)
        && a.timestamp == b.timestamp
}
