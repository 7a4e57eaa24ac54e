//! A Zipkin v2 span exporter: spans as JSON, posted to the collector, as
//! classic Knative's OpenCensus Zipkin exporter sends them.
//!
//! OpenTelemetry's own Zipkin exporter is deprecated; the format is small
//! and stable (`POST` of a JSON array to `/api/v2/spans`), so it is
//! written here.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Request};
use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, Value};
use opentelemetry_http::HttpClient;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use serde_json::{Map, json};

/// Sends spans to a Zipkin collector.
#[derive(Debug)]
pub struct ZipkinExporter {
    client: HyperClient,
    endpoint: http::Uri,
    /// The local endpoint of every span: the pod.
    local: serde_json::Value,
}

impl ZipkinExporter {
    /// Posts to `endpoint` (the full URL, as Knative's
    /// `TRACING_CONFIG_ZIPKIN_ENDPOINT`), with spans from `service` at `ip`.
    pub fn new(endpoint: http::Uri, service: &str, ip: Option<IpAddr>) -> Self {
        let mut local = Map::new();
        local.insert("serviceName".into(), service.into());
        match ip {
            Some(IpAddr::V4(ip)) => {
                local.insert("ipv4".into(), ip.to_string().into());
            }
            Some(IpAddr::V6(ip)) => {
                local.insert("ipv6".into(), ip.to_string().into());
            }
            None => {}
        }
        Self {
            client: crate::otlp::plain_http_client(),
            endpoint,
            local: local.into(),
        }
    }

    fn span(&self, span: &SpanData) -> serde_json::Value {
        let micros = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_micros() as u64
        };
        let start = micros(span.start_time);
        let mut tags: Map<String, serde_json::Value> = span
            .attributes
            .iter()
            .map(|kv| (kv.key.to_string(), tag(&kv.value).into()))
            .collect();
        if let Status::Error { description } = &span.status {
            tags.insert("error".into(), description.to_string().into());
        }
        let mut out = json!({
            "traceId": format!("{:032x}", span.span_context.trace_id()),
            "id": format!("{:016x}", span.span_context.span_id()),
            "name": span.name,
            "timestamp": start,
            "duration": micros(span.end_time).saturating_sub(start).max(1),
            "localEndpoint": self.local,
            "tags": tags,
        });
        if span.parent_span_id != SpanId::INVALID {
            out["parentId"] = format!("{:016x}", span.parent_span_id).into();
        }
        let kind = match span.span_kind {
            SpanKind::Server => Some("SERVER"),
            SpanKind::Client => Some("CLIENT"),
            SpanKind::Producer => Some("PRODUCER"),
            SpanKind::Consumer => Some("CONSUMER"),
            SpanKind::Internal => None,
        };
        if let Some(kind) = kind {
            out["kind"] = kind.into();
        }
        out
    }
}

fn tag(value: &Value) -> String {
    match value {
        Value::Array(Array::String(items)) => items
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(","),
        v => v.to_string(),
    }
}

impl SpanExporter for ZipkinExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans: Vec<_> = batch.iter().map(|s| self.span(s)).collect();
        let body =
            serde_json::to_vec(&spans).map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(bytes::Bytes::from(body))
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        // The client's own timeout bounds the request.
        let res = self
            .client
            .send_bytes(req)
            .await
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        let status = res.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(OTelSdkError::InternalFailure(format!(
                "the Zipkin collector answered {status}"
            )))
        }
    }
}
