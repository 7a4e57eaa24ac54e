//! Log lines in the shape Knative's zap loggers write them.
//!
//! Every line is one JSON object, on stderr by default (Knative's default
//! zap config) or where `outputPaths` says:
//!
//! ```json
//! {"severity":"INFO","timestamp":"2026-01-02T03:04:05.123456789Z","logger":"queueproxy",
//!  "caller":"src/server.rs:88","message":"...","knative.dev/key":"ns/rev",
//!  "knative.dev/pod":"pod", ...event fields}
//! ```
//!
//! Keys, severity spelling and timestamp format come from
//! `SERVING_LOGGING_CONFIG` (see [`Logging`]); the field order is zap's. The
//! layer is a plain [`tracing_subscriber::Layer`], so code logs with
//! `tracing`'s macros. Events from dependencies are shown from `WARN` up only.
//! Like zap, repeated lines are sampled: per level and message, the first
//! 100 of a second are written, then every 100th.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, Write as _};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use serde_json::ser::CharEscape;
use time::OffsetDateTime;
use tracing::field::{Field, Visit};
use tracing::{Event, Level as TraceLevel, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

use qproxy_core::config::Revision;

use crate::config::{Level, LevelStyle, LogOutput, LogSampling, Logging, TimeStyle};

/// The prefix of the targets whose events follow the configured level:
/// a target starts with its crate's name, and every crate of qproxy's is
/// `qproxy` or `qproxy_*`.
const OURS: &str = "qproxy";

/// A [`Layer`] writing zap-style JSON lines.
#[derive(Debug)]
pub struct ZapLayer {
    format: Format,
    max: TraceLevel,
    sampler: Option<Sampler>,
    sinks: Vec<Sink>,
}

/// Where a line is written.
#[derive(Debug)]
enum Sink {
    Stdout,
    Stderr,
    File(Mutex<File>),
}

impl Sink {
    fn write(&self, line: &[u8]) {
        // A closed output is no reason to stop serving.
        let _ = match self {
            Sink::Stdout => std::io::stdout().lock().write_all(line),
            Sink::Stderr => std::io::stderr().lock().write_all(line),
            Sink::File(f) => f
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write_all(line),
        };
    }
}

/// zap's sampler: counts lines per level and message within each second.
#[derive(Debug)]
struct Sampler {
    sampling: LogSampling,
    window: Mutex<Window>,
}

/// The counts of one second.
#[derive(Debug, Default)]
struct Window {
    second: u64,
    /// Lines so far, by level and hash of the message.
    counts: HashMap<(TraceLevel, u64), u64>,
}

impl Sampler {
    fn allow(&self, level: TraceLevel, message: &str, second: u64) -> bool {
        let mut hasher = std::hash::DefaultHasher::new();
        message.hash(&mut hasher);
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if window.second != second {
            *window = Window {
                second,
                counts: HashMap::new(),
            };
        }
        let n = window.counts.entry((level, hasher.finish())).or_insert(0);
        *n += 1;
        let LogSampling {
            initial,
            thereafter,
        } = self.sampling;
        *n <= initial || (thereafter != 0 && (*n - initial).is_multiple_of(thereafter))
    }
}

#[derive(Debug)]
struct Format {
    logging: Logging,
    logger: &'static str,
    /// `,"knative.dev/key":"...","knative.dev/pod":"..."`, rendered once.
    context: String,
}

impl ZapLayer {
    /// A layer for the given format, naming the revision and pod on every
    /// line. An output file that cannot be opened is replaced by stderr; the
    /// reasons are returned for logging.
    pub fn new(logging: &Logging, revision: &Revision) -> (Self, Vec<String>) {
        let mut problems = Vec::new();
        let mut sinks: Vec<Sink> = logging
            .outputs
            .iter()
            .filter_map(|o| match o {
                LogOutput::Stdout => Some(Sink::Stdout),
                LogOutput::Stderr => Some(Sink::Stderr),
                LogOutput::File(path) => match File::options().create(true).append(true).open(path)
                {
                    Ok(f) => Some(Sink::File(Mutex::new(f))),
                    Err(e) => {
                        problems.push(format!("cannot open log output {}: {e}", path.display()));
                        None
                    }
                },
            })
            .collect();
        if sinks.is_empty() {
            sinks.push(Sink::Stderr);
        }
        (Self::with_sinks(logging, revision, sinks), problems)
    }

    fn with_sinks(logging: &Logging, revision: &Revision, sinks: Vec<Sink>) -> Self {
        let mut context = String::new();
        context.push_str(",\"knative.dev/key\":");
        push_json_str(
            &mut context,
            &format!("{}/{}", revision.namespace, revision.name),
        );
        context.push_str(",\"knative.dev/pod\":");
        push_json_str(&mut context, &revision.pod);
        let logger = if logging.fallback_reason.is_some() {
            "fallback-logger.queueproxy"
        } else {
            "queueproxy"
        };
        Self {
            sampler: logging.sampling.map(|sampling| Sampler {
                sampling,
                window: Mutex::new(Window::default()),
            }),
            sinks,
            format: Format {
                logging: logging.clone(),
                logger,
                context,
            },
            max: match logging.level {
                Level::Debug => TraceLevel::DEBUG,
                Level::Info => TraceLevel::INFO,
                Level::Warn => TraceLevel::WARN,
                Level::Error => TraceLevel::ERROR,
            },
        }
    }

    /// Events of qproxy's own crates follow the configured level; other
    /// crates' only show from `WARN` up.
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        let ours = meta.target().starts_with(OURS);
        let max = if ours {
            self.max
        } else {
            self.max.min(TraceLevel::WARN)
        };
        *meta.level() <= max
    }

    /// Renders one event as a JSON line (with the trailing newline), or
    /// `None` when the sampler drops it.
    fn render(&self, event: &Event<'_>, now: SystemTime) -> Option<String> {
        let f = &self.format;
        let cfg = &f.logging;
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(sampler) = &self.sampler {
            let second = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            if !sampler.allow(*meta.level(), &fields.message, second) {
                return None;
            }
        }
        let mut line = String::with_capacity(256);
        line.push('{');
        let mut first = true;
        let mut key = |line: &mut String, k: &str| {
            if !std::mem::take(&mut first) {
                line.push(',');
            }
            push_json_str(line, k);
            line.push(':');
        };
        if let Some(k) = &cfg.level_key {
            key(&mut line, k);
            push_json_str(&mut line, severity(cfg.level_style, *meta.level()));
        }
        if let Some(k) = &cfg.time_key {
            key(&mut line, k);
            push_time(&mut line, cfg.time_style, now);
        }
        if let Some(k) = &cfg.name_key {
            key(&mut line, k);
            push_json_str(&mut line, f.logger);
        }
        if let (Some(k), Some(file)) = (&cfg.caller_key, meta.file()) {
            key(&mut line, k);
            let caller = format!("{}:{}", short_caller(file), meta.line().unwrap_or(0));
            push_json_str(&mut line, &caller);
        }
        if let Some(k) = &cfg.message_key {
            key(&mut line, k);
            push_json_str(&mut line, &fields.message);
        }
        if first {
            // Every key was switched off: keep the object well-formed.
            line.push_str(&f.context[1..]);
        } else {
            line.push_str(&f.context);
        }
        line.push_str(&fields.rest);
        line.push_str("}\n");
        Some(line)
    }
}

impl<S: Subscriber> Layer<S> for ZapLayer {
    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.wants(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if let Some(line) = self.render(event, SystemTime::now()) {
            for sink in &self.sinks {
                sink.write(line.as_bytes());
            }
        }
    }
}

/// Installs the JSON logger for the whole process and routes panics through
/// it, then logs `warnings` (settings that were not honoured). Does nothing
/// if a logger is already installed.
pub fn init(logging: &Logging, revision: &Revision, warnings: &[String]) {
    let (layer, problems) = ZapLayer::new(logging, revision);
    if tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).is_err()
    {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %payload, location = %location, "task panicked");
    }));
    if let Some(reason) = &logging.fallback_reason {
        tracing::warn!(
            error = %reason,
            "Failed to parse logging config - using default zap production config"
        );
    }
    for warning in problems.iter().chain(warnings) {
        tracing::warn!("{warning}");
    }
}

fn severity(style: LevelStyle, level: TraceLevel) -> &'static str {
    match (style, level) {
        (LevelStyle::Lowercase, TraceLevel::ERROR) => "error",
        (LevelStyle::Lowercase, TraceLevel::WARN) => "warn",
        (LevelStyle::Lowercase, TraceLevel::INFO) => "info",
        (LevelStyle::Lowercase, _) => "debug",
        (_, TraceLevel::ERROR) => "ERROR",
        (LevelStyle::Stackdriver, TraceLevel::WARN) => "WARNING",
        (_, TraceLevel::WARN) => "WARN",
        (_, TraceLevel::INFO) => "INFO",
        (_, _) => "DEBUG",
    }
}

/// zap's short caller: the file's directory and name, `pkg/file.go:line`.
fn short_caller(file: &str) -> &str {
    match file.rfind('/') {
        Some(last) => match file[..last].rfind('/') {
            Some(prev) => &file[prev + 1..],
            None => file,
        },
        None => file,
    }
}

fn push_time(out: &mut String, style: TimeStyle, now: SystemTime) {
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let t = OffsetDateTime::from(now);
    let date = |out: &mut String| {
        let _ = write!(
            out,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        );
    };
    match style {
        TimeStyle::Rfc3339Nano => {
            out.push('"');
            date(out);
            let nanos = t.nanosecond();
            if nanos != 0 {
                let digits = format!("{nanos:09}");
                out.push('.');
                out.push_str(digits.trim_end_matches('0'));
            }
            out.push_str("Z\"");
        }
        TimeStyle::Rfc3339 => {
            out.push('"');
            date(out);
            out.push_str("Z\"");
        }
        TimeStyle::Iso8601 => {
            out.push('"');
            date(out);
            let _ = write!(out, ".{:03}Z\"", t.millisecond());
        }
        TimeStyle::Millis => {
            let _ = write!(out, "{}", since_epoch.as_secs_f64() * 1e3);
        }
        TimeStyle::Nanos => {
            let _ = write!(out, "{}", since_epoch.as_nanos());
        }
        TimeStyle::Epoch => {
            let _ = write!(out, "{}", since_epoch.as_secs_f64());
        }
    }
}

/// Appends `s` as a JSON string literal, escaped as zap (Knative's
/// logger) escapes it.
fn push_json_str(out: &mut String, s: &str) {
    let mut json = serde_json::Serializer::with_formatter(Utf8Sink(out), ZapEscapes);
    // Neither the sink nor a string's serialization can fail.
    let _ = serde::Serialize::serialize(s, &mut json);
}

/// serde_json's compact form, but for the two controls zap writes as
/// `\u00XX` where JSON's short forms `\b` and `\f` exist.
struct ZapEscapes;

impl serde_json::ser::Formatter for ZapEscapes {
    fn write_char_escape<W>(&mut self, writer: &mut W, escape: CharEscape) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        match escape {
            CharEscape::Backspace => writer.write_all(b"\\u0008"),
            CharEscape::FormFeed => writer.write_all(b"\\u000c"),
            other => serde_json::ser::CompactFormatter.write_char_escape(writer, other),
        }
    }
}

/// A `String` as an `io::Write` for serde_json, which writes whole UTF-8
/// pieces: the string's own runs and ASCII escapes.
struct Utf8Sink<'a>(&'a mut String);

impl io::Write for Utf8Sink<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let text = std::str::from_utf8(bytes).map_err(io::Error::other)?;
        self.0.push_str(text);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Collects an event's message and renders its other fields as JSON members.
#[derive(Default)]
struct Fields {
    message: String,
    /// `,"k":v` for each field but the message.
    rest: String,
}

impl Fields {
    fn key(&mut self, field: &Field) {
        self.rest.push(',');
        push_json_str(&mut self.rest, field.name());
        self.rest.push(':');
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.key(field);
            push_json_str(&mut self.rest, &text);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.message);
        } else {
            self.key(field);
            push_json_str(&mut self.rest, value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.key(field);
        if value.is_finite() {
            let _ = write!(self.rest, "{value}");
        } else {
            push_json_str(&mut self.rest, &value.to_string());
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // Like Go's wrapped errors: the whole chain in one string.
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(e) = source {
            let _ = write!(text, ": {e}");
            source = e.source();
        }
        self.key(field);
        push_json_str(&mut self.rest, &text);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use qproxy_core::config::{Generation, Vars, knative_defaults};

    /// A layer that renders with [`ZapLayer`] into memory.
    struct Capture {
        inner: ZapLayer,
        lines: Arc<Mutex<Vec<String>>>,
        now: SystemTime,
    }

    impl<S: Subscriber> Layer<S> for Capture {
        fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
            self.inner.wants(meta)
        }

        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            if let Some(line) = self.inner.render(event, self.now) {
                self.lines.lock().unwrap().push(line);
            }
        }
    }

    fn capture(logging: &Logging, now: SystemTime, f: impl FnOnce()) -> Vec<serde_json::Value> {
        capture_raw(logging, now, f)
            .iter()
            .map(|l| {
                assert!(l.ends_with("}\n"), "{l}");
                serde_json::from_str(l).unwrap()
            })
            .collect()
    }

    fn capture_raw(logging: &Logging, now: SystemTime, f: impl FnOnce()) -> Vec<String> {
        let vars = knative_defaults(Generation::Classic, 8080);
        let revision = Revision::from_vars(&vars).unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let layer = Capture {
            inner: ZapLayer::with_sinks(logging, &revision, Vec::new()),
            lines: lines.clone(),
            now,
        };
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        std::mem::take(&mut *lines.lock().unwrap())
    }

    fn at(secs: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
    }

    fn logging(config: &str, level: &str) -> Logging {
        let vars = Vars::from_pairs([
            ("SERVING_LOGGING_CONFIG", config),
            ("SERVING_LOGGING_LEVEL", level),
        ]);
        Logging::from_vars(&vars, &mut Vec::new()).unwrap()
    }

    #[test]
    fn strings_are_escaped_as_zap_escapes_them() {
        let mut out = String::new();
        push_json_str(&mut out, "a\"b\\c/\n\r\t\u{8}\u{c}\u{1f}\u{7f}é\u{2028}");
        // zap: \u00XX for every control but \n, \r and \t; DEL, `/` and
        // U+2028 as they are.
        assert_eq!(
            out,
            "\"a\\\"b\\\\c/\\n\\r\\t\\u0008\\u000c\\u001f\u{7f}é\u{2028}\""
        );
    }

    #[test]
    fn default_shape_matches_knative() {
        let raw = capture_raw(&Logging::default(), at(1_700_000_000, 120_000_000), || {
            tracing::info!(listener = "main", port = 8012u64, "Starting http server");
        });
        let line: serde_json::Value = serde_json::from_str(&raw[0]).unwrap();
        let mut keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // zap's order: level, time, name, caller, message, context, fields.
        keys.sort_by_key(|k| raw[0].find(&format!("\"{k}\":")).unwrap());
        assert_eq!(
            keys,
            [
                "severity",
                "timestamp",
                "logger",
                "caller",
                "message",
                "knative.dev/key",
                "knative.dev/pod",
                "listener",
                "port"
            ]
        );
        assert_eq!(line["severity"], "INFO");
        assert_eq!(line["timestamp"], "2023-11-14T22:13:20.12Z");
        assert_eq!(line["logger"], "queueproxy");
        assert!(line["caller"].as_str().unwrap().starts_with("src/log.rs:"));
        assert_eq!(line["message"], "Starting http server");
        assert_eq!(line["knative.dev/key"], "default/hello-00001");
        assert_eq!(
            line["knative.dev/pod"],
            "hello-00001-deployment-6d8d4bd5b-x7k2p"
        );
        assert_eq!(line["port"], 8012);
    }

    #[test]
    fn every_qproxy_crate_follows_the_level_and_others_show_from_warn() {
        let lines = capture(&logging("", "debug"), at(1_700_000_000, 0), || {
            tracing::debug!(target: "qproxy::server", "sidecar");
            tracing::debug!(target: "qproxy_transport::client", "http1");
            tracing::debug!(target: "qproxy_breaker", "breaker");
            tracing::info!(target: "h2::proto", "a dependency's info");
            tracing::warn!(target: "h2::proto", "a dependency's warning");
        });
        let messages: Vec<&str> = lines
            .iter()
            .map(|l| l["message"].as_str().unwrap())
            .collect();
        assert_eq!(
            messages,
            ["sidecar", "http1", "breaker", "a dependency's warning"]
        );
    }

    #[test]
    fn whole_seconds_have_no_fraction() {
        let lines = capture(&Logging::default(), at(1_700_000_000, 0), || {
            tracing::warn!("w");
        });
        assert_eq!(lines[0]["timestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(lines[0]["severity"], "WARNING");
    }

    #[test]
    fn level_threshold_applies() {
        let lines = capture(&logging("", "warn"), at(0, 0), || {
            tracing::debug!("d");
            tracing::info!("i");
            tracing::warn!("w");
            tracing::error!("e");
        });
        let messages: Vec<_> = lines.iter().map(|l| l["message"].clone()).collect();
        assert_eq!(messages, ["w", "e"]);
    }

    #[test]
    fn knative_example_config_is_lowercase_iso8601() {
        let cfg = logging(
            r#"{"encoderConfig":{"timeKey":"timestamp","levelKey":"severity","levelEncoder":"","timeEncoder":"iso8601"}}"#,
            "debug",
        );
        let lines = capture(&cfg, at(1_700_000_000, 5_000_000), || {
            tracing::debug!("d");
        });
        assert_eq!(lines[0]["severity"], "debug");
        assert_eq!(lines[0]["timestamp"], "2023-11-14T22:13:20.005Z");
    }

    #[test]
    fn custom_keys_and_omitted_keys() {
        let cfg = logging(
            r#"{"encoderConfig":{"levelKey":"lvl","timeKey":"","nameKey":"","callerKey":"","messageKey":"msg","levelEncoder":"capital","timeEncoder":"nanos"}}"#,
            "",
        );
        let lines = capture(&cfg, at(1, 5), || tracing::warn!("careful"));
        let obj = lines[0].as_object().unwrap();
        assert_eq!(obj["lvl"], "WARN");
        assert_eq!(obj["msg"], "careful");
        assert!(!obj.contains_key("timestamp"));
        assert!(!obj.contains_key("logger"));
        assert!(!obj.contains_key("caller"));
    }

    #[test]
    fn nanos_and_epoch_times_are_numbers() {
        let cfg = logging(r#"{"encoderConfig":{"timeEncoder":"nanos"}}"#, "");
        let lines = capture(&cfg, at(1, 5), || tracing::info!("x"));
        assert_eq!(lines[0]["timestamp"], 1_000_000_005u64);
        let cfg = logging(r#"{"encoderConfig":{"timeEncoder":"epoch"}}"#, "");
        let lines = capture(&cfg, at(2, 500_000_000), || tracing::info!("x"));
        assert_eq!(lines[0]["timestamp"], 2.5);
    }

    #[test]
    fn fallback_logger_is_named() {
        let cfg = logging("{broken", "");
        let lines = capture(&cfg, at(0, 0), || tracing::info!("x"));
        assert_eq!(lines[0]["logger"], "fallback-logger.queueproxy");
    }

    #[test]
    fn strings_are_escaped_and_errors_carry_their_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::other("inner \"quoted\""));
        let lines = capture(&Logging::default(), at(0, 0), || {
            tracing::error!(
                error = &err as &(dyn std::error::Error + 'static),
                text = "a\nb\u{1}",
                "boom"
            );
        });
        assert_eq!(lines[0]["error"], "outer: inner \"quoted\"");
        assert_eq!(lines[0]["text"], "a\nb\u{1}");
        assert_eq!(lines[0]["severity"], "ERROR");
    }

    #[test]
    fn dependency_events_below_warn_are_dropped() {
        let lines = capture(&logging("", "debug"), at(0, 0), || {
            tracing::debug!(target: "h2::codec", "frame");
            tracing::warn!(target: "h2::codec", "odd peer");
            tracing::debug!("ours");
        });
        let messages: Vec<_> = lines.iter().map(|l| l["message"].clone()).collect();
        assert_eq!(messages, ["odd peer", "ours"]);
    }

    #[test]
    fn repeated_lines_are_sampled_like_zap() {
        let cfg = logging(r#"{"sampling":{"initial":3,"thereafter":5}}"#, "");
        let lines = capture(&cfg, at(10, 0), || {
            for i in 0..20 {
                tracing::info!(i, "same");
            }
            tracing::info!("other");
            tracing::warn!("same");
        });
        let kept: Vec<_> = lines
            .iter()
            .filter(|l| l["message"] == "same" && l["severity"] == "INFO")
            .map(|l| l["i"].as_u64().unwrap())
            .collect();
        // The first 3, then every 5th: the 8th, 13th and 18th.
        assert_eq!(kept, [0, 1, 2, 7, 12, 17]);
        assert!(lines.iter().any(|l| l["message"] == "other"));
        assert!(lines.iter().any(|l| l["severity"] == "WARNING"));
    }

    #[test]
    fn sampling_windows_are_one_second() {
        let cfg = logging(r#"{"sampling":{"initial":1,"thereafter":0}}"#, "");
        let vars = knative_defaults(Generation::Classic, 8080);
        let revision = Revision::from_vars(&vars).unwrap();
        let layer = ZapLayer::with_sinks(&cfg, &revision, Vec::new());
        let sampler = layer.sampler.as_ref().unwrap();
        assert!(sampler.allow(TraceLevel::INFO, "m", 5));
        assert!(!sampler.allow(TraceLevel::INFO, "m", 5));
        assert!(sampler.allow(TraceLevel::INFO, "m", 6));
    }

    #[test]
    fn unopenable_output_file_falls_back_to_stderr() {
        let cfg = logging(r#"{"outputPaths":["/nonexistent-dir/q.log"]}"#, "");
        let vars = knative_defaults(Generation::Classic, 8080);
        let revision = Revision::from_vars(&vars).unwrap();
        let (layer, problems) = ZapLayer::new(&cfg, &revision);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(matches!(layer.sinks[..], [Sink::Stderr]));
    }

    #[test]
    fn short_caller_keeps_the_last_directory() {
        assert_eq!(short_caller("crates/qproxy/src/server.rs"), "src/server.rs");
        assert_eq!(
            short_caller("src/layers/forwarded.rs"),
            "layers/forwarded.rs"
        );
        assert_eq!(short_caller("main.rs"), "main.rs");
        assert_eq!(short_caller("src/main.rs"), "src/main.rs");
    }
}
