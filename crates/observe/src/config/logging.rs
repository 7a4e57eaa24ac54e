//! The log format: Knative's zap configuration, read the way knative.dev/pkg
//! reads it.
//!
//! `SERVING_LOGGING_CONFIG` holds config-logging's `zap-logger-config` (often
//! empty) and `SERVING_LOGGING_LEVEL` its `loglevel.queueproxy`. Knative
//! starts from a Stackdriver-style production config (keys `severity`,
//! `timestamp`, `logger`, `caller`, `message`; upper-case severities; RFC 3339
//! nanosecond timestamps) and lays the JSON over it, so keys the JSON leaves
//! out keep those defaults. A JSON document that does not parse is not fatal
//! in Knative: it logs a warning and uses the defaults. qproxy does the same,
//! so that a cluster whose queue-proxies start today keeps starting.

use serde::Deserialize;

use qproxy_core::config::ConfigError;
use qproxy_core::config::Vars;

/// Log severity threshold, in zap's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `debug`.
    Debug,
    /// `info`.
    Info,
    /// `warn`.
    Warn,
    /// `error`, and zap's `dpanic`, `panic` and `fatal`, which qproxy treats
    /// as error.
    Error,
}

impl Level {
    /// Parses a zap level name (lower- or upper-case, as zap accepts).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "debug" | "DEBUG" => Some(Level::Debug),
            "info" | "INFO" | "" => Some(Level::Info),
            "warn" | "WARN" => Some(Level::Warn),
            "error" | "ERROR" | "dpanic" | "DPANIC" | "panic" | "PANIC" | "fatal" | "FATAL" => {
                Some(Level::Error)
            }
            _ => None,
        }
    }
}

/// How the severity is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelStyle {
    /// Stackdriver names: `DEBUG`, `INFO`, `WARNING`, `ERROR` (Knative's default).
    Stackdriver,
    /// zap `capital`: `DEBUG`, `INFO`, `WARN`, `ERROR`.
    Capital,
    /// zap default: `debug`, `info`, `warn`, `error`.
    Lowercase,
}

/// How the timestamp is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeStyle {
    /// RFC 3339 with nanoseconds, trailing zeros trimmed (Knative's default).
    Rfc3339Nano,
    /// RFC 3339, whole seconds.
    Rfc3339,
    /// ISO 8601 with milliseconds (`2006-01-02T15:04:05.000Z0700`).
    Iso8601,
    /// Milliseconds since the epoch, as a float.
    Millis,
    /// Nanoseconds since the epoch, as an integer.
    Nanos,
    /// Seconds since the epoch, as a float (zap's fallback).
    Epoch,
}

/// The log line format and threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logging {
    /// Events below this level are dropped.
    pub level: Level,
    /// Key of the severity field; `None` omits it.
    pub level_key: Option<String>,
    /// Key of the timestamp field; `None` omits it.
    pub time_key: Option<String>,
    /// Key of the logger name field; `None` omits it.
    pub name_key: Option<String>,
    /// Key of the caller field; `None` omits it.
    pub caller_key: Option<String>,
    /// Key of the message field; `None` omits it.
    pub message_key: Option<String>,
    /// Severity spelling.
    pub level_style: LevelStyle,
    /// Timestamp format.
    pub time_style: TimeStyle,
    /// Where lines go (zap's `outputPaths`); Knative's default is stderr.
    pub outputs: Vec<LogOutput>,
    /// zap's sampling: per level and message and per second, the first
    /// `initial` lines are written, then every `thereafter`-th.
    pub sampling: Option<LogSampling>,
    /// Set when `SERVING_LOGGING_CONFIG` did not parse and the defaults were
    /// used instead: the reason, to be logged once logging is up.
    pub fallback_reason: Option<String>,
}

/// A destination of log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOutput {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// A file, appended to.
    File(std::path::PathBuf),
}

/// zap's sampling settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct LogSampling {
    /// Lines per level and message per second written in full.
    #[serde(default)]
    pub initial: u64,
    /// After those, every this many-th line is written (0: none).
    #[serde(default)]
    pub thereafter: u64,
}

impl Default for Logging {
    /// Knative's fallback: the Stackdriver-style production config.
    fn default() -> Self {
        Self {
            level: Level::Info,
            level_key: Some("severity".into()),
            time_key: Some("timestamp".into()),
            name_key: Some("logger".into()),
            caller_key: Some("caller".into()),
            message_key: Some("message".into()),
            level_style: LevelStyle::Stackdriver,
            time_style: TimeStyle::Rfc3339Nano,
            outputs: vec![LogOutput::Stderr],
            sampling: Some(LogSampling {
                initial: 100,
                thereafter: 100,
            }),
            fallback_reason: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ZapConfig {
    level: Option<String>,
    encoding: Option<String>,
    output_paths: Option<Vec<String>>,
    disable_caller: Option<bool>,
    /// Absent keeps the default; `null` turns sampling off.
    #[serde(default, deserialize_with = "present")]
    sampling: Option<Option<LogSampling>>,
    encoder_config: Option<EncoderConfig>,
}

/// Tells a key given as `null` (`Some(None)`) from an absent one (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EncoderConfig {
    time_key: Option<String>,
    level_key: Option<String>,
    name_key: Option<String>,
    caller_key: Option<String>,
    message_key: Option<String>,
    level_encoder: Option<String>,
    time_encoder: Option<serde_json::Value>,
}

const LOGGING_CONFIG: &str = "SERVING_LOGGING_CONFIG";
const LOGGING_LEVEL: &str = "SERVING_LOGGING_LEVEL";

impl Logging {
    /// Reads the two logging variables; settings of the zap config that
    /// qproxy does not honour are added to `warnings`.
    pub fn from_vars(vars: &Vars, warnings: &mut Vec<String>) -> Result<Self, ConfigError> {
        let json = vars.required(LOGGING_CONFIG)?;
        let level_override = vars.required(LOGGING_LEVEL)?;
        let override_level = match level_override {
            "" => None,
            v => Some(Level::parse(v).ok_or_else(|| {
                ConfigError::invalid(
                    LOGGING_LEVEL,
                    v,
                    "expected debug, info, warn, error, dpanic, panic or fatal",
                )
            })?),
        };
        let mut notes = Vec::new();
        let mut logging = match Self::from_zap_json(json, &mut notes) {
            Ok(l) => {
                warnings.append(&mut notes);
                l
            }
            Err(reason) => Logging {
                fallback_reason: Some(format!("{LOGGING_CONFIG}: {reason}")),
                ..Logging::default()
            },
        };
        if let Some(level) = override_level {
            logging.level = level;
        }
        Ok(logging)
    }

    /// Lays a zap JSON config over the defaults.
    fn from_zap_json(json: &str, warnings: &mut Vec<String>) -> Result<Self, String> {
        let mut out = Logging::default();
        if json.is_empty() {
            return Ok(out);
        }
        let zap: ZapConfig =
            qproxy_core::config::json::from_json_object(json).map_err(|e| e.to_string())?;
        if let Some(level) = zap.level {
            out.level = Level::parse(&level).ok_or_else(|| format!("unknown level {level:?}"))?;
        }
        if let Some(paths) = zap.output_paths {
            out.outputs = paths
                .into_iter()
                .map(|p| match p.as_str() {
                    "stdout" => LogOutput::Stdout,
                    "stderr" => LogOutput::Stderr,
                    _ => LogOutput::File(p.into()),
                })
                .collect();
        }
        if let Some(sampling) = zap.sampling {
            out.sampling = sampling;
        }
        if zap.disable_caller == Some(true) {
            out.caller_key = None;
        }
        match zap.encoding.as_deref() {
            None | Some("json") => {}
            Some("console") => warnings.push(format!(
                "{LOGGING_CONFIG}: console encoding is not supported; logging JSON"
            )),
            Some(other) => return Err(format!("no encoder registered for name {other:?}")),
        }
        if let Some(enc) = zap.encoder_config {
            let key = |k: Option<String>, into: &mut Option<String>| {
                if let Some(k) = k {
                    *into = (!k.is_empty()).then_some(k);
                }
            };
            key(enc.time_key, &mut out.time_key);
            key(enc.level_key, &mut out.level_key);
            key(enc.name_key, &mut out.name_key);
            key(enc.caller_key, &mut out.caller_key);
            key(enc.message_key, &mut out.message_key);
            if let Some(style) = enc.level_encoder {
                // zap's LevelEncoder: anything but these is lower-case.
                out.level_style = match style.as_str() {
                    "capital" | "capitalColor" => LevelStyle::Capital,
                    _ => LevelStyle::Lowercase,
                };
            }
            match enc.time_encoder {
                None => {}
                Some(serde_json::Value::String(style)) => {
                    // zap's TimeEncoder: anything unknown is epoch seconds.
                    out.time_style = match style.as_str() {
                        "rfc3339nano" | "RFC3339Nano" => TimeStyle::Rfc3339Nano,
                        "rfc3339" | "RFC3339" => TimeStyle::Rfc3339,
                        "iso8601" | "ISO8601" => TimeStyle::Iso8601,
                        "millis" => TimeStyle::Millis,
                        "nanos" => TimeStyle::Nanos,
                        _ => TimeStyle::Epoch,
                    };
                }
                // zap also takes `{"layout": "<Go layout>"}`; Go layouts are
                // not reproduced, RFC 3339 nano keeps the line parseable.
                Some(_) => out.time_style = TimeStyle::Rfc3339Nano,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// config-logging's documented `zap-logger-config`.
    const KNATIVE_EXAMPLE: &str = r#"{
        "level": "info",
        "development": false,
        "outputPaths": ["stdout"],
        "errorOutputPaths": ["stderr"],
        "encoding": "json",
        "encoderConfig": {
          "timeKey": "timestamp",
          "levelKey": "severity",
          "nameKey": "logger",
          "callerKey": "caller",
          "messageKey": "message",
          "stacktraceKey": "stacktrace",
          "lineEnding": "",
          "levelEncoder": "",
          "timeEncoder": "iso8601",
          "durationEncoder": "",
          "callerEncoder": ""
        }
      }"#;

    fn logging(config: &str, level: &str) -> Result<Logging, ConfigError> {
        logging_warned(config, level).map(|(l, _)| l)
    }

    fn logging_warned(config: &str, level: &str) -> Result<(Logging, Vec<String>), ConfigError> {
        let mut warnings = Vec::new();
        let vars = Vars::from_pairs([(LOGGING_CONFIG, config), (LOGGING_LEVEL, level)]);
        Logging::from_vars(&vars, &mut warnings).map(|l| (l, warnings))
    }

    #[test]
    fn empty_config_is_the_stackdriver_default() {
        let l = logging("", "").unwrap();
        assert_eq!(l, Logging::default());
        assert_eq!(l.level_style, LevelStyle::Stackdriver);
        assert_eq!(l.time_style, TimeStyle::Rfc3339Nano);
    }

    #[test]
    fn knative_example_config() {
        let l = logging(KNATIVE_EXAMPLE, "").unwrap();
        assert_eq!(l.level, Level::Info);
        assert_eq!(l.level_key.as_deref(), Some("severity"));
        assert_eq!(l.level_style, LevelStyle::Lowercase);
        assert_eq!(l.time_style, TimeStyle::Iso8601);
        assert_eq!(l.outputs, [LogOutput::Stdout]);
        assert_eq!(l.sampling, Logging::default().sampling);
        assert_eq!(l.fallback_reason, None);
    }

    #[test]
    fn default_goes_to_stderr_with_zap_sampling() {
        let l = logging("", "");
        let l = l.unwrap();
        assert_eq!(l.outputs, [LogOutput::Stderr]);
        assert_eq!(
            l.sampling,
            Some(LogSampling {
                initial: 100,
                thereafter: 100
            })
        );
    }

    #[test]
    fn outputs_sampling_caller_and_encoding() {
        let l = logging(
            r#"{"outputPaths":["stdout","/tmp/q.log"],"sampling":null,"disableCaller":true}"#,
            "",
        )
        .unwrap();
        assert_eq!(
            l.outputs,
            [LogOutput::Stdout, LogOutput::File("/tmp/q.log".into())]
        );
        assert_eq!(l.sampling, None);
        assert_eq!(l.caller_key, None);
        let l = logging(r#"{"sampling":{"initial":5,"thereafter":10}}"#, "").unwrap();
        assert_eq!(
            l.sampling,
            Some(LogSampling {
                initial: 5,
                thereafter: 10
            })
        );
        let (l, warnings) = logging_warned(r#"{"encoding":"console"}"#, "").unwrap();
        assert_eq!(warnings.len(), 1);
        assert_eq!(l.fallback_reason, None);
        let l = logging(r#"{"encoding":"yaml"}"#, "").unwrap();
        assert!(l.fallback_reason.is_some());
    }

    #[test]
    fn level_variable_overrides_the_config() {
        assert_eq!(
            logging(KNATIVE_EXAMPLE, "debug").unwrap().level,
            Level::Debug
        );
        assert_eq!(logging("", "warn").unwrap().level, Level::Warn);
        assert_eq!(logging("", "fatal").unwrap().level, Level::Error);
        assert_eq!(
            logging(r#"{"level":"error"}"#, "").unwrap().level,
            Level::Error
        );
    }

    #[test]
    fn both_variables_are_required() {
        let err = Logging::from_vars(&Vars::from_pairs([(LOGGING_LEVEL, "")]), &mut Vec::new())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "SERVING_LOGGING_CONFIG is required but not set"
        );
        let err = Logging::from_vars(&Vars::from_pairs([(LOGGING_CONFIG, "")]), &mut Vec::new())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "SERVING_LOGGING_LEVEL is required but not set"
        );
    }

    #[test]
    fn unknown_level_is_an_error() {
        let err = logging("", "verbose").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"SERVING_LOGGING_LEVEL="verbose" is invalid"#)
        );
    }

    #[test]
    fn unparseable_config_falls_back_with_a_reason() {
        let l = logging("{not json", "debug").unwrap();
        assert!(
            l.fallback_reason
                .as_deref()
                .unwrap()
                .starts_with(LOGGING_CONFIG)
        );
        assert_eq!(l.level, Level::Debug);
        assert_eq!(l.level_key.as_deref(), Some("severity"));
        let l = logging(r#"{"level":"loud"}"#, "").unwrap();
        assert!(l.fallback_reason.is_some());
    }

    #[test]
    fn custom_keys_and_encoders() {
        let l = logging(
            r#"{"encoderConfig":{"levelKey":"lvl","timeKey":"","messageKey":"msg","levelEncoder":"capital","timeEncoder":"nanos"}}"#,
            "",
        )
        .unwrap();
        assert_eq!(l.level_key.as_deref(), Some("lvl"));
        assert_eq!(l.time_key, None);
        assert_eq!(l.message_key.as_deref(), Some("msg"));
        assert_eq!(l.name_key.as_deref(), Some("logger"));
        assert_eq!(l.level_style, LevelStyle::Capital);
        assert_eq!(l.time_style, TimeStyle::Nanos);
    }
}
