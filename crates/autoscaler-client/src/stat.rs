//! The `Stat` message (see `stat.proto` next to this file), derived with
//! prost's macros so that building needs no `protoc`.

/// One report of a pod's load, as Knative's autoscaler decodes it.
///
/// Encoded with [`prost::Message::encode_to_vec`], it is byte for byte what
/// Knative's queue-proxy serves: fields in tag order, zero values left out.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Stat {
    /// The pod the figures come from.
    #[prost(string, tag = "1")]
    pub pod_name: String,
    /// Time-weighted average of requests in flight over the last period.
    #[prost(double, tag = "2")]
    pub average_concurrent_requests: f64,
    /// The part of it that came through the activator.
    #[prost(double, tag = "3")]
    pub average_proxied_concurrent_requests: f64,
    /// Requests that arrived in the last period, per second.
    #[prost(double, tag = "4")]
    pub request_count: f64,
    /// The part of them that came through the activator.
    #[prost(double, tag = "5")]
    pub proxied_request_count: f64,
    /// Seconds since the reporter started.
    #[prost(double, tag = "6")]
    pub process_uptime: f64,
    /// Seconds since the Unix epoch; left 0, as the queue-proxy does.
    #[prost(int64, tag = "7")]
    pub timestamp: i64,
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn encodes_like_gogo_protobuf() {
        // Only the pod name: what is served before the first report.
        let stat = Stat {
            pod_name: "p".into(),
            ..Stat::default()
        };
        assert_eq!(stat.encode_to_vec(), b"\x0a\x01p");

        let stat = Stat {
            pod_name: "pod".into(),
            average_concurrent_requests: 1.5,
            request_count: 2.0,
            process_uptime: 0.25,
            ..Stat::default()
        };
        let mut expected = b"\x0a\x03pod".to_vec();
        expected.push(0x11); // field 2, fixed64
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.push(0x21); // field 4
        expected.extend_from_slice(&2.0f64.to_le_bytes());
        expected.push(0x31); // field 6
        expected.extend_from_slice(&0.25f64.to_le_bytes());
        assert_eq!(stat.encode_to_vec(), expected);
        assert_eq!(Stat::decode(&expected[..]).unwrap(), stat);
    }
}
